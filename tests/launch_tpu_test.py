"""Tests of scripts/launch_tpu.py and scripts/tpu_commands.py: the exact gcloud commands, that --dry_run runs nothing, the
polling loop against a fake gcloud, and the detached job script run here with bash."""

import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest
from absl import app, flags
from absl.testing import flagsaver

from scripts import launch_tpu, tpu_commands

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TPU_VM = ['gcloud', 'compute', 'tpus', 'tpu-vm']
_QUEUED = ['gcloud', 'compute', 'tpus', 'queued-resources']
_INSTALL = (
  'sudo apt-get update -qq && sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3.11 '
  'python3.11-venv && python3.11 -m venv ~/specdec_venv && cd specdec_jax && '
  '~/specdec_venv/bin/pip install -q -e . "jax[tpu]"'
)
_RUN_SH = (
  "( cd specdec_jax || exit; . ~/specdec_venv/bin/activate || exit; export A='two words'; "
  'python -m experiments.translate --config=experiments/configs/ende.py '
  '--workdir=/tmp/specdec_run ); '
  'echo $? > specdec_job/status.tmp && mv specdec_job/status.tmp specdec_job/status'
)
_START = (
  'mkdir -p specdec_job /tmp/specdec_run && rm -f specdec_job/status specdec_job/status.tmp && '
  f"printf '%s\\n' {shlex.quote(_RUN_SH)} > specdec_job/run.sh && "
  '{ nohup setsid bash specdec_job/run.sh > specdec_job/log 2>&1 < /dev/null & '
  'echo $! > specdec_job/pid; }'
)
# Values the remote shell must pass on untouched: spaces, both quotes, $, backticks, a newline.
_NASTY = ('two words', """it's "quoted" $HOME `id` \\ ; & | *""", 'line one\nline two', 'a=b', '')


def _main(*args: str) -> None:
  """Runs the absl main with these flags, restoring every flag afterwards."""
  with flagsaver.flagsaver():
    flags.FLAGS(['launch_tpu', *args])
    launch_tpu.main(['launch_tpu'])


def _fail_if_called(*args, **kwargs):
  raise AssertionError(f'a dry run executed {args} {kwargs}')


def _whats(steps):
  return [step.what for step in steps]


def test_repo_root_is_this_repo():
  assert tpu_commands.REPO_ROOT == _REPO and tpu_commands.Job().repo_dir == str(_REPO)


@pytest.mark.parametrize(
  ('accelerator_type', 'workers'),
  [
    ('v4-8', 1),
    ('v4-16', 2),
    ('v4-32', 4),
    ('v4-128', 16),
    ('v5p-8', 1),
    ('v5p-16', 2),
    ('v5litepod-1', 1),
    ('v5litepod-4', 1),
    ('v5litepod-8', 1),
    ('v5litepod-16', 4),
    ('v5litepod-256', 64),
  ],
)
def test_num_workers_from_the_accelerator_type(accelerator_type, workers):
  assert tpu_commands.num_workers(accelerator_type) == workers
  assert (
    tpu_commands.TpuVm(name='t', zone='z', accelerator_type=accelerator_type).workers == workers
  )


@pytest.mark.parametrize('accelerator_type', ['v3-8', 'v4-12', 'v4-4', 'v5litepod-2', 'v6e-8'])
def test_unknown_accelerator_type_needs_num_workers(accelerator_type):
  with pytest.raises(ValueError, match='pass --num_workers'):
    tpu_commands.TpuVm(name='t', zone='z', accelerator_type=accelerator_type)
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type=accelerator_type, workers=3)
  assert vm.workers == 3


def test_v4_8_dry_run_commands():
  vm = tpu_commands.TpuVm(name='specdec-v4-8', zone='us-central2-b', accelerator_type='v4-8')
  job = tpu_commands.Job(env=(('A', 'two words'),))
  zone = '--zone=us-central2-b'
  ssh = _TPU_VM + ['ssh', 'specdec-v4-8']
  steps = tpu_commands.plan(vm, job, delete_after=True)
  assert [(step.what, step.argv) for step in steps] == [
    (
      'create',
      _TPU_VM
      + [
        'create',
        'specdec-v4-8',
        '--accelerator-type=v4-8',
        '--version=tpu-ubuntu2204-base',
        zone,
      ],
    ),
    (
      'copy',
      _TPU_VM + ['scp', '--recurse', str(_REPO), 'specdec-v4-8:specdec_jax', '--worker=all', zone],
    ),
    ('install', ssh + ['--worker=all', '--command', _INSTALL, zone]),
    ('start', ssh + ['--worker=all', '--command', _START, zone]),
    ('poll', ssh + ['--worker=0', '--command', 'cat specdec_job/status 2>/dev/null || true', zone]),
    ('tail', ssh + ['--worker=0', '--command', 'tail -n 20 specdec_job/log', zone]),
    (
      'fetch',
      _TPU_VM
      + [
        'scp',
        '--recurse',
        'specdec-v4-8:/tmp/specdec_run',
        'specdec-v4-8:specdec_job',
        '/tmp/specdec_tpu/worker_0',
        '--worker=0',
        zone,
      ],
    ),
    ('delete', _TPU_VM + ['delete', 'specdec-v4-8', '--quiet', zone]),
  ]


def test_v4_32_pod_slice_polls_and_fetches_every_worker():
  vm = tpu_commands.TpuVm(
    name='pod',
    zone='us-central2-b',
    accelerator_type='v4-32',
    version='tpu-vm-v4-base',
    project='my-project',
  )
  job = tpu_commands.Job(results_dir='/tmp/out', local_dir='/tmp/here', env=(('A', 'two words'),))
  steps = tpu_commands.plan(vm, job, delete_after=True)
  assert _whats(steps) == (
    ['create', 'copy', 'install', 'start'] + ['poll'] * 4 + ['tail'] + ['fetch'] * 4 + ['delete']
  )
  for step in steps:
    assert step.argv[-2:] == ['--zone=us-central2-b', '--project=my-project']
  create, copy, install, start = (step.argv for step in steps[:4])
  assert create[4:7] == ['create', 'pod', '--accelerator-type=v4-32']
  assert '--version=tpu-vm-v4-base' in create and '--spot' not in create
  # Every host of the slice gets the code, the install and the job; each is polled and fetched.
  for argv in (copy, install, start):
    assert '--worker=all' in argv
  assert start[start.index('--command') + 1] == tpu_commands.start_script(job)
  assert "; export A='two words'; python -m experiments.translate" in tpu_commands.job_script(job)
  polls = [step.argv for step in steps if step.what == 'poll']
  fetches = [step.argv for step in steps if step.what == 'fetch']
  for i in range(4):
    assert polls[i][4:8] == ['ssh', 'pod', f'--worker={i}', '--command']
    assert fetches[i][4:10] == [
      'scp',
      '--recurse',
      'pod:/tmp/out',
      'pod:specdec_job',
      f'/tmp/here/worker_{i}',
      f'--worker={i}',
    ]
  assert steps[-1].argv[4:7] == ['delete', 'pod', '--quiet']


def test_spot_and_queued_resources():
  spot = tpu_commands.TpuVm(name='t', zone='z', spot=True)
  assert tpu_commands.create_command(spot) == _TPU_VM + [
    'create',
    't',
    '--accelerator-type=v4-8',
    '--version=tpu-ubuntu2204-base',
    '--spot',
    '--zone=z',
  ]
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type='v4-32', spot=True, queued=True)
  steps = tpu_commands.plan(vm, tpu_commands.Job(), delete_after=True)
  assert _whats(steps)[:3] == ['create', 'wait', 'copy']
  assert steps[0].argv == _QUEUED + [
    'create',
    't-qr',
    '--node-id=t',
    '--accelerator-type=v4-32',
    '--runtime-version=tpu-ubuntu2204-base',
    '--spot',
    '--zone=z',
  ]
  assert steps[1].argv == _QUEUED + ['describe', 't-qr', '--format=value(state.state)', '--zone=z']
  # The node is addressed by its own name; deleting the queued resource deletes the node too.
  assert steps[2].argv[4:7] == ['scp', '--recurse', str(_REPO)] and 't:specdec_jax' in steps[2].argv
  assert steps[-1].argv == _QUEUED + ['delete', 't-qr', '--force', '--quiet', '--zone=z']


def test_detach_only_stops_after_start_and_attach_begins_at_poll():
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type='v4-16')
  job = tpu_commands.Job()
  assert _whats(tpu_commands.plan(vm, job, delete_after=False, detach_only=True)) == [
    'create',
    'copy',
    'install',
    'start',
  ]
  assert _whats(tpu_commands.plan(vm, job, delete_after=True, attach=True)) == [
    'poll',
    'poll',
    'tail',
    'fetch',
    'fetch',
    'delete',
  ]
  with pytest.raises(ValueError, match='pass one of them'):
    tpu_commands.plan(vm, job, delete_after=False, detach_only=True, attach=True)
  with pytest.raises(ValueError, match='delete the VM under the running job'):
    tpu_commands.plan(vm, job, delete_after=True, detach_only=True)


def test_stage_checkpoint_to_a_bucket_runs_here_before_create():
  job = tpu_commands.Job(checkpoint='/ckpt/xxl', checkpoint_to='gs://bucket/xxl')
  steps = tpu_commands.plan(tpu_commands.TpuVm(name='t', zone='z'), job, delete_after=False)
  assert _whats(steps)[:2] == ['stage', 'create'] and _whats(steps).count('stage') == 1
  assert steps[0].argv == ['gcloud', 'storage', 'cp', '-r', '/ckpt/xxl', 'gs://bucket/xxl']


def test_stage_checkpoint_from_a_bucket_onto_every_worker():
  job = tpu_commands.Job(checkpoint='gs://bucket/xxl', checkpoint_to='/data/ckpt dir/xxl')
  steps = tpu_commands.plan(tpu_commands.TpuVm(name='t', zone='z'), job, delete_after=False)
  assert _whats(steps)[:5] == ['create', 'copy', 'install', 'stage', 'start']
  stage = steps[3].argv
  assert stage[4:7] == ['ssh', 't', '--worker=all']
  assert stage[stage.index('--command') + 1] == (
    "mkdir -p '/data/ckpt dir' && gcloud storage cp -r gs://bucket/xxl '/data/ckpt dir/xxl'"
  )


@pytest.mark.parametrize(
  ('checkpoint', 'checkpoint_to', 'message'),
  [
    ('/ckpt', None, 'go together'),
    (None, 'gs://b/x', 'go together'),
    ('/ckpt', '/elsewhere', 'must be a gs:// URL'),
  ],
)
def test_bad_staging_raises(checkpoint, checkpoint_to, message):
  with pytest.raises(ValueError, match=message):
    tpu_commands.Job(checkpoint=checkpoint, checkpoint_to=checkpoint_to)


def test_parse_env_keeps_values_whole():
  assert tpu_commands.parse_env(['A=1', 'B_2=x=y', '_C=', 'D=two words']) == (
    ('A', '1'),
    ('B_2', 'x=y'),
    ('_C', ''),
    ('D', 'two words'),
  )


@pytest.mark.parametrize(
  ('item', 'message'),
  [
    ('NOVALUE', 'must be KEY=VALUE'),
    ('=v', 'not a shell variable name'),
    ('1X=v', 'not a shell variable name'),
    ('A-B=v', 'not a shell variable name'),
    ('A B=v', 'not a shell variable name'),
    ('$(id)=v', 'not a shell variable name'),
  ],
)
def test_malformed_env_raises(item, message):
  with pytest.raises(ValueError, match=message):
    tpu_commands.parse_env([item])
  with pytest.raises(app.UsageError, match=message):
    _main('--name=t', '--zone=z', f'--env={item}', '--dry_run')


def test_remote_command_is_one_argument_quoted_with_shlex():
  command = """python -c 'import jax; print(jax.devices())' && echo "a b" > out.txt"""
  job = tpu_commands.Job(command=command, remote_dir='my repo', python='/opt/py 3/bin/python')
  vm = tpu_commands.TpuVm(name='t', zone='z')
  _, _, install, start, *_ = (step.argv for step in tpu_commands.plan(vm, job, delete_after=False))
  install_script = install[install.index('--command') + 1]
  # What we insert is quoted for the remote shell; the user's command is passed on verbatim.
  assert tpu_commands.job_script(job).startswith(
    f"( cd 'my repo' || exit; . ~/specdec_venv/bin/activate || exit; {command} ); "
  )
  assert "'/opt/py 3/bin/python' -m venv ~/specdec_venv && cd 'my repo' && " in install_script
  assert install_script.endswith(' install -q -e . "jax[tpu]"')  # quoted: no remote glob
  # Each printed line pastes into a local shell as exactly these arguments.
  for argv in (install, start):
    assert shlex.split(shlex.join(argv)) == argv


def test_no_apt_packages_installs_none():
  script = tpu_commands.install_script(tpu_commands.Job(apt_packages=()))
  assert 'apt-get' not in script and script.startswith('python3.11 -m venv ~/specdec_venv && ')


def _start_here(home: pathlib.Path, job: tpu_commands.Job) -> int:
  """Runs the start script as the ssh would, in `home` with a fake venv; returns its session id.

  The script must pass `bash -n` and return while the job runs on.
  """
  (home / 'specdec_venv' / 'bin').mkdir(parents=True, exist_ok=True)
  (home / 'specdec_venv' / 'bin' / 'activate').write_text('export FROM_VENV=yes\n')
  (home / job.remote_dir).mkdir(exist_ok=True)
  script = tpu_commands.start_script(job)
  subprocess.run(['bash', '-n', '-c', script], check=True)
  env = dict(os.environ, HOME=str(home))
  start = subprocess.Popen(['bash', '-c', script], cwd=home, env=env, start_new_session=True)
  assert start.wait(timeout=30) == 0
  return start.pid


def _wait_for(path: pathlib.Path, seconds: float = 20) -> str:
  deadline = time.monotonic() + seconds
  while not path.exists():
    assert time.monotonic() < deadline, f'{path} never appeared'
    time.sleep(0.05)
  return path.read_text()


def _gated(command: str, gate: str) -> str:
  """`command` once the file `gate` exists in the home directory (the job runs in the repo).

  Before waiting, the job touches `running` there: it has started, past the start script.
  """
  return f'touch ../running; while [ ! -e ../{gate} ]; do sleep 0.05; done; {command}'


def test_detached_job_keeps_env_values_and_writes_log_and_status(tmp_path):
  """The generated start script, run here with bash: the job outlives its ssh session."""
  env = tuple((f'V{i}', value) for i, value in enumerate(_NASTY))
  command = '; '.join(f'printf "<%s>\\n" "${key}"' for key, _ in env)
  command += '; echo "venv=$FROM_VENV pwd=$(basename "$PWD")"'
  job = tpu_commands.Job(
    command=_gated(command, 'go'), env=env, results_dir=str(tmp_path / 'results')
  )
  try:
    session = _start_here(tmp_path, job)
    assert not (tmp_path / job.status_file).exists()  # the start returned; the job waits
    _wait_for(tmp_path / 'running')
    # What a dropped ssh does: SIGHUP to the session's process group. The job left it (setsid)
    # and ignores SIGHUP (nohup): without both it dies here and never writes its status.
    try:
      os.killpg(session, signal.SIGHUP)
    except ProcessLookupError:
      pass
  finally:
    (tmp_path / 'go').touch()
  assert _wait_for(tmp_path / job.status_file) == '0\n'
  log = (tmp_path / job.log_file).read_text()
  assert log == ''.join(f'<{value}>\n' for value in _NASTY) + 'venv=yes pwd=specdec_jax\n'
  assert (tmp_path / 'results').is_dir()
  assert (tmp_path / 'specdec_job' / 'run.sh').read_text() == tpu_commands.job_script(job) + '\n'
  assert int((tmp_path / 'specdec_job' / 'pid').read_text()) > 0


def test_detached_job_records_a_failing_exit_status_and_restarts_clean(tmp_path):
  job = tpu_commands.Job(command='echo failing >&2; exit 3', results_dir=str(tmp_path / 'out'))
  _start_here(tmp_path, job)
  assert _wait_for(tmp_path / job.status_file) == '3\n'
  assert (tmp_path / job.log_file).read_text() == 'failing\n'
  # A second start clears the old status first, so a poll never reads the previous job's.
  job = tpu_commands.Job(command=_gated('cd /nonexistent', 'go'), results_dir=str(tmp_path / 'out'))
  try:
    _start_here(tmp_path, job)
    assert not (tmp_path / job.status_file).exists()
  finally:
    (tmp_path / 'go').touch()
  assert _wait_for(tmp_path / job.status_file) == '1\n'


class _FakeGcloud:
  """A `subprocess.run` that records each argv and answers as gcloud would.

  `statuses[i]` lists what successive polls of worker i print ('' while running; None: the ssh
  fails); `states` what successive `queued-resources describe` print; `fails(argv)` makes any
  other command fail.
  """

  def __init__(self, statuses=None, states=(), fails=lambda argv: False):
    self.calls = []
    self.statuses = {i: list(answers) for i, answers in (statuses or {}).items()}
    self.states = list(states)
    self.fails = fails

  def __call__(self, argv, check, stdout=None, text=None):
    assert check
    self.calls.append(argv)
    out = ''
    if argv[3:5] == ['queued-resources', 'describe']:
      out = self.states.pop(0) + '\n'
    elif argv[4] == 'ssh' and argv[argv.index('--command') + 1].startswith('cat '):
      out = self.statuses[int(argv[6].removeprefix('--worker='))].pop(0)
    if out is None or self.fails(argv):
      raise subprocess.CalledProcessError(255, argv)
    return subprocess.CompletedProcess(argv, 0, stdout=out if stdout else None)


@pytest.fixture
def sleeps(monkeypatch):
  """The poll intervals slept (nothing is slept)."""
  slept = []
  monkeypatch.setattr(launch_tpu.time, 'sleep', slept.append)
  return slept


def test_launch_polls_until_every_worker_has_a_status_then_fetches_each(
  monkeypatch, tmp_path, sleeps
):
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type='v4-16')
  job = tpu_commands.Job(local_dir=str(tmp_path / 'results'))
  gcloud = _FakeGcloud(statuses={0: ['', '0\n'], 1: ['0\n']})
  monkeypatch.setattr(subprocess, 'run', gcloud)
  launch_tpu.launch(vm, job, delete_after=True, dry_run=False, poll_interval=7, log_lines=5)
  create, copy, install, start, poll0, poll1, tail, fetch0, fetch1, delete = (
    step.argv for step in tpu_commands.plan(vm, job, delete_after=True, log_lines=5)
  )
  # Round 1: worker 1 is done, worker 0 runs; round 2 polls only worker 0.
  assert gcloud.calls == [
    create,
    copy,
    install,
    start,
    poll0,
    poll1,
    tail,
    poll0,
    tail,
    fetch0,
    fetch1,
    delete,
  ]
  assert sleeps == [7]
  assert (tmp_path / 'results' / 'worker_0').is_dir() and (
    tmp_path / 'results' / 'worker_1'
  ).is_dir()


def test_a_failed_worker_fails_the_launch_after_every_fetch(monkeypatch, tmp_path, sleeps):
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type='v4-16')
  job = tpu_commands.Job(local_dir=str(tmp_path))
  gcloud = _FakeGcloud(statuses={0: ['0'], 1: ['137']})
  monkeypatch.setattr(subprocess, 'run', gcloud)
  with pytest.raises(launch_tpu.JobFailedError, match=r'workers \[1\] \(exit status \{1: 137\}'):
    launch_tpu.launch(vm, job, delete_after=True, dry_run=False)
  *_, fetch0, fetch1, delete = (step.argv for step in tpu_commands.plan(vm, job, delete_after=True))
  assert gcloud.calls[-4:] == [
    fetch0,
    fetch1,
    tpu_commands.log_tail_command(vm, job, 1, 20),
    delete,
  ]
  assert sleeps == []


def test_a_failed_fetch_still_fetches_the_other_workers_and_deletes(monkeypatch, tmp_path, sleeps):
  vm = tpu_commands.TpuVm(name='t', zone='z', accelerator_type='v4-24')
  job = tpu_commands.Job(local_dir=str(tmp_path))
  fetch1 = tpu_commands.fetch_command(vm, job, 1)
  gcloud = _FakeGcloud(statuses={0: ['0'], 1: ['0'], 2: ['0']}, fails=lambda argv: argv == fetch1)
  monkeypatch.setattr(subprocess, 'run', gcloud)
  with pytest.raises(
    RuntimeError, match=r'fetch failed on workers \[1\]: fetch again with --attach'
  ):
    launch_tpu.launch(vm, job, delete_after=True, dry_run=False)
  *_, fetch0, _, fetch2, delete = (
    step.argv for step in tpu_commands.plan(vm, job, delete_after=True)
  )
  assert gcloud.calls[-4:] == [fetch0, fetch1, fetch2, delete]


def test_poll_survives_dropped_ssh_but_gives_up_on_a_gone_vm(monkeypatch, tmp_path, sleeps):
  vm = tpu_commands.TpuVm(name='t', zone='z')
  job = tpu_commands.Job(local_dir=str(tmp_path))
  gcloud = _FakeGcloud(statuses={0: [None, None, '', '0']})
  monkeypatch.setattr(subprocess, 'run', gcloud)
  launch_tpu.launch(vm, job, delete_after=False, dry_run=False, attach=True, poll_interval=1)
  assert sleeps == [1, 1, 1]
  assert gcloud.calls[-1] == tpu_commands.fetch_command(vm, job, 0)
  sleeps.clear()
  gone = launch_tpu.MAX_POLL_FAILURES * [None]
  monkeypatch.setattr(subprocess, 'run', _FakeGcloud(statuses={0: gone}))
  with pytest.raises(RuntimeError, match='could not reach a worker'):
    launch_tpu.launch(vm, job, delete_after=False, dry_run=False, attach=True)
  assert len(sleeps) == launch_tpu.MAX_POLL_FAILURES - 1


def test_garbage_status_is_an_error(monkeypatch, tmp_path, sleeps):
  monkeypatch.setattr(subprocess, 'run', _FakeGcloud(statuses={0: ['oops']}))
  vm = tpu_commands.TpuVm(name='t', zone='z')
  with pytest.raises(RuntimeError, match="wrote 'oops' to specdec_job/status"):
    launch_tpu.launch(
      vm, tpu_commands.Job(local_dir=str(tmp_path)), delete_after=False, dry_run=False
    )


def test_queued_launch_waits_for_active(monkeypatch, tmp_path, sleeps):
  vm = tpu_commands.TpuVm(name='t', zone='z', queued=True)
  job = tpu_commands.Job(local_dir=str(tmp_path))
  gcloud = _FakeGcloud(
    statuses={0: ['0']}, states=['WAITING_FOR_RESOURCES', 'PROVISIONING', 'ACTIVE']
  )
  monkeypatch.setattr(subprocess, 'run', gcloud)
  launch_tpu.launch(vm, job, delete_after=True, dry_run=False, poll_interval=30)
  wait = tpu_commands.queued_state_command(vm)
  assert gcloud.calls[:5] == [
    tpu_commands.create_command(vm),
    wait,
    wait,
    wait,
    tpu_commands.copy_repo_command(vm, job),
  ]
  assert sleeps == [30, 30]
  assert gcloud.calls[-1] == tpu_commands.delete_command(vm)


def test_failed_queued_resource_is_deleted(monkeypatch, tmp_path, sleeps):
  vm = tpu_commands.TpuVm(name='t', zone='z', queued=True)
  gcloud = _FakeGcloud(states=['WAITING_FOR_RESOURCES', 'FAILED'])
  monkeypatch.setattr(subprocess, 'run', gcloud)
  with pytest.raises(RuntimeError, match='queued resource t-qr is FAILED'):
    launch_tpu.launch(
      vm, tpu_commands.Job(local_dir=str(tmp_path)), delete_after=True, dry_run=False
    )
  assert gcloud.calls[-1] == _QUEUED + ['delete', 't-qr', '--force', '--quiet', '--zone=z']
  assert len(gcloud.calls) == 4


def test_failed_start_still_deletes_the_vm(monkeypatch, tmp_path):
  vm = tpu_commands.TpuVm(name='t', zone='z')
  job = tpu_commands.Job(local_dir=str(tmp_path))
  start = tpu_commands.ssh_command(vm, tpu_commands.start_script(job))
  gcloud = _FakeGcloud(fails=lambda argv: argv == start)
  monkeypatch.setattr(subprocess, 'run', gcloud)
  with pytest.raises(subprocess.CalledProcessError):
    launch_tpu.launch(vm, job, delete_after=True, dry_run=False)
  create, copy, install, start, *_, delete = (
    step.argv for step in tpu_commands.plan(vm, job, delete_after=True)
  )
  assert gcloud.calls == [create, copy, install, start, delete]


def test_failed_create_deletes_nothing(monkeypatch, tmp_path):
  """The name may be taken by someone else's VM: deleting it then would be a disaster."""
  gcloud = _FakeGcloud(fails=lambda argv: argv[4] == 'create')
  monkeypatch.setattr(subprocess, 'run', gcloud)
  vm = tpu_commands.TpuVm(name='t', zone='z')
  with pytest.raises(subprocess.CalledProcessError):
    launch_tpu.launch(
      vm, tpu_commands.Job(local_dir=str(tmp_path)), delete_after=True, dry_run=False
    )
  assert gcloud.calls == [tpu_commands.create_command(vm)]


def test_detach_only_starts_and_prints_the_attach_command(monkeypatch, tmp_path, capsys):
  vm = tpu_commands.TpuVm(
    name='t', zone='z', accelerator_type='v5litepod-16', project='p', queued=True
  )
  job = tpu_commands.Job(results_dir='/tmp/out', local_dir=str(tmp_path), job_dir='jobs/one')
  gcloud = _FakeGcloud(states=['ACTIVE'])
  monkeypatch.setattr(subprocess, 'run', gcloud)
  launch_tpu.launch(vm, job, delete_after=False, dry_run=False, detach_only=True)
  assert gcloud.calls[-1] == tpu_commands.ssh_command(vm, tpu_commands.start_script(job))
  attach = (
    capsys.readouterr().out.splitlines()[-1].removeprefix('Started. Poll and fetch later with: ')
  )
  argv = shlex.split(attach)
  assert argv[:4] == ['python', '-m', 'scripts.launch_tpu', '--attach']
  # That command line, as a dry run, polls and fetches this same job.
  monkeypatch.setattr(subprocess, 'run', _fail_if_called)
  _main(*argv[3:], '--dry_run', '--delete_after')
  printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith('#')]
  want = tpu_commands.plan(vm, job, delete_after=True, attach=True)
  assert printed == [shlex.join(step.argv) for step in want]
  assert _whats(want) == ['poll'] * 4 + ['tail'] + ['fetch'] * 4 + ['delete']


def test_dry_run_prints_every_command_and_executes_nothing(monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(subprocess, 'run', _fail_if_called)
  monkeypatch.setattr(os, 'makedirs', _fail_if_called)
  local_dir = tmp_path / 'results'
  _main(
    '--name=specdec-v4-32',
    '--zone=us-central2-b',
    '--accelerator_type=v4-32',
    '--project=p',
    f'--local_dir={local_dir}',
    '--env=MSG=it\'s "a b"',
    '--env=N=1',
    '--spot',
    '--stage_checkpoint=gs://b/ckpt',
    '--stage_checkpoint_to=/tmp/ckpt',
    '--poll_interval=90',
    '--delete_after',
    '--dry_run',
  )
  vm = tpu_commands.TpuVm(
    name='specdec-v4-32', zone='us-central2-b', accelerator_type='v4-32', project='p', spot=True
  )
  job = tpu_commands.Job(
    local_dir=str(local_dir),
    env=(('MSG', 'it\'s "a b"'), ('N', '1')),
    checkpoint='gs://b/ckpt',
    checkpoint_to='/tmp/ckpt',
  )
  want = [shlex.join(step.argv) for step in tpu_commands.plan(vm, job, delete_after=True)]
  comment = '# every 90 s until each worker has written specdec_job/status:'
  lines = capsys.readouterr().out.splitlines()
  assert lines == want[:5] + [comment] + want[5:]
  assert [shlex.split(line)[4] for line in want] == (
    ['create', 'scp', 'ssh', 'ssh', 'ssh'] + ['ssh'] * 5 + ['scp'] * 4 + ['delete']
  )
  assert not local_dir.exists()


@pytest.mark.parametrize(
  ('kwargs', 'message'),
  [
    (dict(name='My_TPU', zone='z'), 'lowercase letters'),
    (dict(name=None, zone='z'), 'lowercase letters'),
    (dict(name='t', zone=None), '--zone is required'),
    (dict(name='t', zone='z', accelerator_type='v4'), 'like v4-8'),
    (dict(name='t', zone='z', workers=0), 'at least 1'),
  ],
)
def test_bad_vm_raises(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tpu_commands.TpuVm(**kwargs)


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (['--detach_only', '--attach'], 'pass one of them'),
    (['--detach_only', '--delete_after'], 'under the running job'),
    (['--poll_interval=0'], 'at least 1'),
    (['--accelerator_type=v3-8'], 'pass --num_workers'),
    (['--stage_checkpoint=/a'], 'go together'),
  ],
)
def test_bad_flags_are_usage_errors(args, message):
  with pytest.raises(app.UsageError, match=message):
    _main('--name=t', '--zone=z', '--dry_run', *args)


def test_command_line_dry_run(tmp_path):
  """`python -m scripts.launch_tpu` as documented, with a gcloud on PATH that leaves a trace."""
  marker = tmp_path / 'gcloud_ran'
  fake_gcloud = tmp_path / 'bin' / 'gcloud'
  fake_gcloud.parent.mkdir()
  fake_gcloud.write_text(f'#!/bin/sh\ntouch {shlex.quote(str(marker))}\n')
  fake_gcloud.chmod(0o755)
  env = dict(os.environ, PATH=f'{fake_gcloud.parent}{os.pathsep}{os.environ["PATH"]}')
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'scripts.launch_tpu',
      '--name=specdec-v4-8',
      '--zone=us-central2-b',
      '--env=A=two words',
      '--dry_run',
    ],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  lines = [line for line in result.stdout.splitlines() if not line.startswith('#')]
  assert [shlex.split(line)[4] for line in lines] == [
    'create',
    'scp',
    'ssh',
    'ssh',
    'ssh',
    'ssh',
    'scp',
  ]
  assert not marker.exists()
