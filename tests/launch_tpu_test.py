"""Tests of scripts/launch_tpu.py: the exact gcloud commands, and that --dry_run runs nothing."""

import os
import pathlib
import shlex
import subprocess
import sys

import pytest
from absl import flags
from absl.testing import flagsaver

from scripts import launch_tpu

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TPU_VM = ['gcloud', 'compute', 'tpus', 'tpu-vm']
_INSTALL = (
  'sudo apt-get update -qq && sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3.11 '
  'python3.11-venv && python3.11 -m venv ~/specdec_venv && cd specdec_jax && '
  '~/specdec_venv/bin/pip install -q -e . "jax[tpu]"'
)
_RUN = (
  'cd specdec_jax && . ~/specdec_venv/bin/activate && python -m experiments.translate '
  '--config=experiments/configs/ende.py --workdir=/tmp/specdec_run'
)


def _main(*args: str) -> None:
  """Runs the absl main with these flags, restoring every flag afterwards."""
  with flagsaver.flagsaver():
    flags.FLAGS(['launch_tpu', *args])
    launch_tpu.main(['launch_tpu'])


def _fail_if_called(*args, **kwargs):
  raise AssertionError(f'a dry run executed {args} {kwargs}')


def test_repo_root_is_this_repo():
  assert launch_tpu.REPO_ROOT == _REPO and launch_tpu.Job().repo_dir == str(_REPO)


def test_v4_8_commands():
  vm = launch_tpu.TpuVm(name='specdec-v4-8', zone='us-central2-b', accelerator_type='v4-8')
  zone = '--zone=us-central2-b'
  assert launch_tpu.all_commands(vm, launch_tpu.Job(), delete_after=False) == [
    _TPU_VM
    + ['create', 'specdec-v4-8', '--accelerator-type=v4-8', '--version=tpu-ubuntu2204-base', zone],
    _TPU_VM + ['scp', '--recurse', str(_REPO), 'specdec-v4-8:specdec_jax', '--worker=all', zone],
    _TPU_VM + ['ssh', 'specdec-v4-8', '--worker=all', '--command', _INSTALL, zone],
    _TPU_VM + ['ssh', 'specdec-v4-8', '--worker=all', '--command', _RUN, zone],
    _TPU_VM
    + ['scp', '--recurse', 'specdec-v4-8:/tmp/specdec_run', '/tmp/specdec_tpu', '--worker=0', zone],
  ]


def test_v4_32_pod_slice_commands():
  vm = launch_tpu.TpuVm(
    name='pod',
    zone='us-central2-b',
    accelerator_type='v4-32',
    version='tpu-vm-v4-base',
    project='my-project',
  )
  job = launch_tpu.Job(results_dir='/tmp/out', local_dir='/tmp/here')
  create, copy, install, run, fetch, delete = launch_tpu.all_commands(vm, job, delete_after=True)
  for argv in (create, copy, install, run, fetch, delete):
    assert argv[:4] == _TPU_VM
    assert argv[-2:] == ['--zone=us-central2-b', '--project=my-project']
  assert create[4:7] == ['create', 'pod', '--accelerator-type=v4-32']
  assert '--version=tpu-vm-v4-base' in create
  # Every host of the slice gets the code, the install and the job; results come from worker 0.
  for argv in (copy, install, run):
    assert '--worker=all' in argv
  assert fetch[4:9] == ['scp', '--recurse', 'pod:/tmp/out', '/tmp/here', '--worker=0']
  assert delete[4:7] == ['delete', 'pod', '--quiet']


def test_remote_command_is_one_argument_quoted_with_shlex():
  command = """python -c 'import jax; print(jax.devices())' && echo "a b" > out.txt"""
  job = launch_tpu.Job(command=command, remote_dir='my repo', python='/opt/py 3/bin/python')
  vm = launch_tpu.TpuVm(name='t', zone='z')
  _, _, install, run, _ = launch_tpu.all_commands(vm, job, delete_after=False)
  install_script = install[install.index('--command') + 1]
  run_script = run[run.index('--command') + 1]
  # What we insert is quoted for the remote shell; the user's command is passed on verbatim.
  assert run_script == f"cd 'my repo' && . ~/specdec_venv/bin/activate && {command}"
  assert shlex.split(run_script)[:5] == ['cd', 'my repo', '&&', '.', '~/specdec_venv/bin/activate']
  assert "'/opt/py 3/bin/python' -m venv ~/specdec_venv && cd 'my repo' && " in install_script
  assert install_script.endswith(' install -q -e . "jax[tpu]"')  # quoted: no remote glob
  # Each printed line pastes into a local shell as exactly these arguments.
  for argv in (install, run):
    assert shlex.split(shlex.join(argv)) == argv


def test_no_apt_packages_installs_none():
  script = launch_tpu.install_script(launch_tpu.Job(apt_packages=()))
  assert 'apt-get' not in script and script.startswith('python3.11 -m venv ~/specdec_venv && ')


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
    '--delete_after',
    '--dry_run',
  )
  vm = launch_tpu.TpuVm(
    name='specdec-v4-32', zone='us-central2-b', accelerator_type='v4-32', project='p'
  )
  want = launch_tpu.all_commands(vm, launch_tpu.Job(local_dir=str(local_dir)), delete_after=True)
  assert capsys.readouterr().out.splitlines() == [shlex.join(argv) for argv in want]
  assert not local_dir.exists()


def _recording_run(calls, fails=lambda argv: False):
  """A `subprocess.run` that records each argv and raises on those `fails` selects."""

  def run(argv, check):
    assert check
    calls.append(argv)
    if fails(argv):
      raise subprocess.CalledProcessError(1, argv)

  return run


@pytest.mark.parametrize('delete_after', [False, True])
def test_launch_runs_the_commands_in_order(monkeypatch, tmp_path, delete_after):
  calls = []
  monkeypatch.setattr(subprocess, 'run', _recording_run(calls))
  vm = launch_tpu.TpuVm(name='t', zone='z')
  job = launch_tpu.Job(local_dir=str(tmp_path / 'results'))
  launch_tpu.launch(vm, job, delete_after=delete_after, dry_run=False)
  assert calls == launch_tpu.all_commands(vm, job, delete_after=delete_after)
  assert (tmp_path / 'results').is_dir()


def test_failed_run_still_deletes_the_vm(monkeypatch, tmp_path):
  vm = launch_tpu.TpuVm(name='t', zone='z')
  job = launch_tpu.Job(local_dir=str(tmp_path))
  calls = []
  job_fails = lambda argv: launch_tpu.run_script(job) in argv
  monkeypatch.setattr(subprocess, 'run', _recording_run(calls, job_fails))
  with pytest.raises(subprocess.CalledProcessError):
    launch_tpu.launch(vm, job, delete_after=True, dry_run=False)
  create, copy, install, run, _, delete = launch_tpu.all_commands(vm, job, delete_after=True)
  assert calls == [create, copy, install, run, delete]


def test_failed_create_deletes_nothing(monkeypatch, tmp_path):
  """The name may be taken by someone else's VM: deleting it then would be a disaster."""
  calls = []
  monkeypatch.setattr(subprocess, 'run', _recording_run(calls, lambda argv: argv[4] == 'create'))
  vm = launch_tpu.TpuVm(name='t', zone='z')
  with pytest.raises(subprocess.CalledProcessError):
    launch_tpu.launch(vm, launch_tpu.Job(local_dir=str(tmp_path)), delete_after=True, dry_run=False)
  assert calls == [launch_tpu.create_command(vm)]


@pytest.mark.parametrize(
  ('kwargs', 'message'),
  [
    (dict(name='My_TPU', zone='z'), 'lowercase letters'),
    (dict(name=None, zone='z'), 'lowercase letters'),
    (dict(name='t', zone=None), '--zone is required'),
    (dict(name='t', zone='z', accelerator_type='v4'), 'like v4-8'),
  ],
)
def test_bad_vm_raises(kwargs, message):
  with pytest.raises(ValueError, match=message):
    launch_tpu.TpuVm(**kwargs)


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
      '--dry_run',
    ],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  lines = result.stdout.splitlines()
  assert [shlex.split(line)[4] for line in lines] == ['create', 'scp', 'ssh', 'ssh', 'scp']
  assert not marker.exists()
