"""The gcloud commands and remote shell scripts of scripts/launch_tpu.py, as data: a TPU VM and a
job described by frozen dataclasses, each step of a launch (create, copy, install, stage, start,
poll, fetch, delete) built as an argv list by a pure function, and `plan`, the ordered steps. No
flags and nothing run here: launch_tpu.py reads its flags into these and runs the steps; the tests
check the exact commands.
"""

import dataclasses
import os
import pathlib
import posixpath
import re
import shlex
from collections.abc import Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = (
  'python -m experiments.translate --config=experiments/configs/ende.py --workdir=/tmp/specdec_run'
)
VENV = '~/specdec_venv'  # Left unquoted in remote commands: the remote shell expands the ~.


def num_workers(accelerator_type: str) -> int:
  """The hosts ("workers", one TPU VM each) of a slice of this accelerator type.

  v4-N, v5p-N: N counts TensorCores, 2 per chip, 4 chips per host: N / 8 hosts (v4-8: 1 host,
    v4-32: 4). The v5p table of https://cloud.google.com/tpu/docs/v5p lists the same (2x2x1: 8
    cores, 4 chips, 1 host; 2x2x2: 16 cores, 2 hosts).
  v5litepod-N (TPU v5e): N counts chips, one TensorCore each. https://cloud.google.com/tpu/docs/v5e
    ("Configurations"): slices of 1, 4 and 8 chips are one VM; "Each TPU VM in a v5e TPU slice
    contains 1, 4 or 8 chips". Its table counts 8-chip physical hosts (4x4: 16 chips, 2 hosts),
    but the VMs of a multi-host slice hold 4 chips each (machine type ct5lp-hightpu-4t; e.g.
    v5litepod-64 = 16 hosts in marin-community/levanter#1202), so N / 4 workers from 16 chips
    on. If a slice reports otherwise, pass --num_workers.

  Raises:
    ValueError: for any other type or size, naming --num_workers.
  """
  match = re.fullmatch(r'(v4|v5p|v5litepod)-(\d+)', accelerator_type)
  count = int(match.group(2)) if match else 0
  if match and match.group(1) in ('v4', 'v5p') and count >= 8 and count % 8 == 0:
    return count // 8
  if match and match.group(1) == 'v5litepod' and count in (1, 4, 8):
    return 1
  if match and match.group(1) == 'v5litepod' and count >= 16 and count % 4 == 0:
    return count // 4
  raise ValueError(
    f'Unknown number of hosts for --accelerator_type={accelerator_type}: known are v4-N and '
    'v5p-N (N a multiple of 8: N/8 hosts) and v5litepod-N (1, 4, 8: one host; 16 and up: N/4); '
    'pass --num_workers for any other type'
  )


@dataclasses.dataclass(frozen=True)
class TpuVm:
  """A TPU VM or pod slice.

  Attributes:
    name: the VM's name: lowercase letters, digits and hyphens, starting with a letter.
    zone: e.g. 'us-central2-b'.
    accelerator_type: e.g. 'v4-8' (4 chips, 1 host) or 'v4-32' (16 chips, 4 hosts).
    version: the TPU runtime, e.g. 'tpu-ubuntu2204-base'.
    project: the Google Cloud project, or None for gcloud's configured one.
    spot: a spot VM, which Cloud TPU may preempt at any time.
    queued: created through the queued resource `queued_resource` (which waits for capacity).
    workers: hosts in the slice; None: `num_workers(accelerator_type)`.
  """

  name: str
  zone: str
  accelerator_type: str = 'v4-8'
  version: str = 'tpu-ubuntu2204-base'
  project: str | None = None
  spot: bool = False
  queued: bool = False
  workers: int | None = None

  def __post_init__(self):
    if not re.fullmatch(r'[a-z]([-a-z0-9]*[a-z0-9])?', self.name or ''):
      raise ValueError(
        f'--name must be lowercase letters, digits and hyphens, starting with a '
        f'letter and not ending with a hyphen, e.g. specdec-v4-8; got {self.name!r}'
      )
    if not self.zone:
      raise ValueError('--zone is required, e.g. --zone=us-central2-b')
    if not re.fullmatch(r'v\d+[a-z]*-\d+', self.accelerator_type):
      raise ValueError(
        f'--accelerator_type must look like v4-8 or v4-32, got {self.accelerator_type!r}'
      )
    if self.workers is None:
      object.__setattr__(self, 'workers', num_workers(self.accelerator_type))
    elif self.workers < 1:
      raise ValueError(f'--num_workers must be at least 1, got {self.workers}')

  @property
  def queued_resource(self) -> str:
    """The queued resource's name (its node is `name`)."""
    return f'{self.name}-qr'


@dataclasses.dataclass(frozen=True)
class Job:
  """What runs on the VM, and where its files go.

  Attributes:
    command: shell command run on every worker, in the repo copy with the venv active.
    env: (KEY, VALUE) pairs exported before `command` on every worker.
    results_dir: remote directory the command writes; fetched from every worker.
    local_dir: local directory; worker i's files go to `<local_dir>/worker_<i>/`.
    repo_dir: local repo to copy.
    remote_dir: where the repo goes on each worker, relative to the remote home directory.
    job_dir: the job's run.sh, log and status on each worker, relative to the remote home.
    python: remote interpreter that creates the venv (>= 3.11).
    apt_packages: installed with apt-get before the venv is made; empty installs nothing.
    checkpoint: a checkpoint to copy with `gcloud storage cp -r`: a local path or gs://...
    checkpoint_to: where to: gs://... (copied from here), or, when `checkpoint` is gs://..., a
      path on every worker's disk.
  """

  command: str = DEFAULT_COMMAND
  env: tuple[tuple[str, str], ...] = ()
  results_dir: str = '/tmp/specdec_run'
  local_dir: str = '/tmp/specdec_tpu'
  repo_dir: str = str(REPO_ROOT)
  remote_dir: str = 'specdec_jax'
  job_dir: str = 'specdec_job'
  python: str = 'python3.11'
  apt_packages: tuple[str, ...] = ('python3.11', 'python3.11-venv')
  checkpoint: str | None = None
  checkpoint_to: str | None = None

  def __post_init__(self):
    for key, _ in self.env:
      _check_env_key(key)
    if bool(self.checkpoint) != bool(self.checkpoint_to):
      raise ValueError(
        '--stage_checkpoint and --stage_checkpoint_to go together: a checkpoint and where to '
        f'copy it; got {self.checkpoint!r} and {self.checkpoint_to!r}'
      )
    if self.checkpoint and not (_is_gcs(self.checkpoint) or _is_gcs(self.checkpoint_to)):
      raise ValueError(
        'one of --stage_checkpoint and --stage_checkpoint_to must be a gs:// URL (a local '
        'checkpoint goes to a bucket, a bucket one onto each worker); got '
        f'{self.checkpoint!r} and {self.checkpoint_to!r}'
      )

  @property
  def status_file(self) -> str:
    return posixpath.join(self.job_dir, 'status')

  @property
  def log_file(self) -> str:
    return posixpath.join(self.job_dir, 'log')


def _is_gcs(path: str | None) -> bool:
  return bool(path) and path.startswith('gs://')


def _check_env_key(key: str) -> None:
  if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', key):
    raise ValueError(
      f'--env key {key!r} is not a shell variable name: use letters, digits and underscores, '
      'not starting with a digit, e.g. --env=XLA_FLAGS=--xla_dump_to=/tmp/dump'
    )


def parse_env(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
  """['KEY=VALUE', ...] -> ((KEY, VALUE), ...); the value may hold anything, '=' included."""
  pairs = []
  for item in items:
    if '=' not in item:
      raise ValueError(f'--env must be KEY=VALUE, got {item!r}')
    key, value = item.split('=', 1)
    _check_env_key(key)
    pairs.append((key, value))
  return tuple(pairs)


def _gcloud(vm: TpuVm, group: str, verb: str, *args: str) -> list[str]:
  """`gcloud compute tpus <group> <verb> <args>` in `vm`'s zone and project."""
  argv = ['gcloud', 'compute', 'tpus', group, verb, *args, f'--zone={vm.zone}']
  if vm.project:
    argv.append(f'--project={vm.project}')
  return argv


def create_command(vm: TpuVm) -> list[str]:
  """Creates the TPU VM or pod slice, or with `vm.queued` asks the queue for it."""
  spot = ['--spot'] if vm.spot else []
  if vm.queued:
    return _gcloud(
      vm,
      'queued-resources',
      'create',
      vm.queued_resource,
      f'--node-id={vm.name}',
      f'--accelerator-type={vm.accelerator_type}',
      f'--runtime-version={vm.version}',
      *spot,
    )
  return _gcloud(
    vm,
    'tpu-vm',
    'create',
    vm.name,
    f'--accelerator-type={vm.accelerator_type}',
    f'--version={vm.version}',
    *spot,
  )


def queued_state_command(vm: TpuVm) -> list[str]:
  """Prints the queued resource's state (ACTIVE once the VM exists)."""
  return _gcloud(
    vm, 'queued-resources', 'describe', vm.queued_resource, '--format=value(state.state)'
  )


def copy_repo_command(vm: TpuVm, job: Job) -> list[str]:
  """Copies the local repo to `job.remote_dir` on every worker."""
  return _gcloud(
    vm, 'tpu-vm', 'scp', '--recurse', job.repo_dir, f'{vm.name}:{job.remote_dir}', '--worker=all'
  )


def ssh_command(vm: TpuVm, remote_command: str, worker: str = 'all') -> list[str]:
  """Runs the shell command `remote_command` on `worker` ('all', or an index as a string)."""
  return _gcloud(vm, 'tpu-vm', 'ssh', vm.name, f'--worker={worker}', '--command', remote_command)


def install_script(job: Job) -> str:
  """The remote shell command that installs the package and jax[tpu] into a fresh venv."""
  steps = []
  if job.apt_packages:
    # Waits for the dpkg lock, which unattended-upgrades often holds on a freshly booted VM.
    steps += [
      'sudo apt-get update -qq',
      shlex.join(
        [
          'sudo',
          'apt-get',
          '-o',
          'DPkg::Lock::Timeout=600',
          'install',
          '-y',
          '-qq',
          *job.apt_packages,
        ]
      ),
    ]
  steps += [
    f'{shlex.quote(job.python)} -m venv {VENV}',
    f'cd {shlex.quote(job.remote_dir)}',
    f'{VENV}/bin/pip install -q -e . "jax[tpu]"',
  ]  # quoted: [] is a glob
  return ' && '.join(steps)


def stage_commands(vm: TpuVm, job: Job, *, where: str) -> list[list[str]]:
  """The `gcloud storage cp -r` of the checkpoint, if any, run `where`: 'local' or 'workers'.

  To a bucket it runs here; from a bucket to a path, on every worker (the TPU VM images ship
  gcloud), after making the destination's parent directory.
  """
  if not job.checkpoint:
    return []
  copy = ['gcloud', 'storage', 'cp', '-r', job.checkpoint, job.checkpoint_to]
  if _is_gcs(job.checkpoint_to):
    return [copy] if where == 'local' else []
  if where == 'local':
    return []
  parent = posixpath.dirname(job.checkpoint_to.rstrip('/')) or '.'
  return [ssh_command(vm, f'mkdir -p {shlex.quote(parent)} && {shlex.join(copy)}')]


def job_script(job: Job) -> str:
  """The job's run.sh, one line: the command in a subshell, then its exit status, atomically.

  Paths are relative to the directory it starts in (the remote home). The subshell keeps an
  `exit` in the user's command, or a failed cd, from skipping the status file. One line, so
  --dry_run prints one line per command.
  """
  status = shlex.quote(job.status_file)
  steps = [
    f'cd {shlex.quote(job.remote_dir)} || exit',
    f'. {VENV}/bin/activate || exit',
    *(f'export {key}={shlex.quote(value)}' for key, value in job.env),
    job.command,
  ]
  return f'( {"; ".join(steps)} ); echo $? > {status}.tmp && mv {status}.tmp {status}'


def start_script(job: Job) -> str:
  """The remote shell command that writes run.sh and starts it detached; returns at once.

  `setsid` puts the job in a session of its own and `nohup` ignores SIGHUP, so the job outlives
  the ssh session; its stdin, stdout and stderr leave the session, so ssh does not wait for it.
  The results directory is made here, so every worker has one to fetch.
  """
  job_dir, run = shlex.quote(job.job_dir), shlex.quote(posixpath.join(job.job_dir, 'run.sh'))
  status, log = shlex.quote(job.status_file), shlex.quote(job.log_file)
  pid = shlex.quote(posixpath.join(job.job_dir, 'pid'))
  return (
    f'mkdir -p {job_dir} {shlex.quote(job.results_dir)} && rm -f {status} {status}.tmp && '
    f"printf '%s\\n' {shlex.quote(job_script(job))} > {run} && "
    f'{{ nohup setsid bash {run} > {log} 2>&1 < /dev/null & echo $! > {pid}; }}'
  )


def status_command(vm: TpuVm, job: Job, worker: int) -> list[str]:
  """Prints worker `worker`'s exit status, or nothing while its job runs."""
  return ssh_command(vm, f'cat {shlex.quote(job.status_file)} 2>/dev/null || true', str(worker))


def log_tail_command(vm: TpuVm, job: Job, worker: int, lines: int) -> list[str]:
  """Prints the last `lines` lines of worker `worker`'s log."""
  return ssh_command(vm, f'tail -n {lines} {shlex.quote(job.log_file)}', str(worker))


def worker_dir(job: Job, worker: int) -> str:
  """The local directory worker `worker`'s files are fetched into."""
  return os.path.join(job.local_dir, f'worker_{worker}')


def fetch_command(vm: TpuVm, job: Job, worker: int) -> list[str]:
  """Copies `job.results_dir` and `job.job_dir` from worker `worker` into `worker_dir`."""
  sources = [f'{vm.name}:{job.results_dir}', f'{vm.name}:{job.job_dir}']
  return _gcloud(
    vm, 'tpu-vm', 'scp', '--recurse', *sources, worker_dir(job, worker), f'--worker={worker}'
  )


def delete_command(vm: TpuVm) -> list[str]:
  """Deletes the TPU VM (with `vm.queued`: the queued resource and its VM) without asking."""
  if vm.queued:
    return _gcloud(vm, 'queued-resources', 'delete', vm.queued_resource, '--force', '--quiet')
  return _gcloud(vm, 'tpu-vm', 'delete', vm.name, '--quiet')


@dataclasses.dataclass(frozen=True)
class Step:
  """One command of a launch: `what` it does (e.g. 'create', 'poll') and its argv."""

  what: str
  argv: list[str]


def plan(
  vm: TpuVm,
  job: Job,
  *,
  delete_after: bool,
  detach_only: bool = False,
  attach: bool = False,
  log_lines: int = 20,
) -> list[Step]:
  """Every command of a launch in order, one poll round included; what --dry_run prints.

  stage (to a bucket), create, wait (queued), copy, install, stage (onto the workers), start,
  poll (each worker), tail, fetch (each worker), delete. --detach_only ends after start;
  --attach begins at poll.
  """
  check_modes(detach_only=detach_only, attach=attach, delete_after=delete_after)
  steps = []
  if not attach:
    steps += [Step('stage', argv) for argv in stage_commands(vm, job, where='local')]
    steps.append(Step('create', create_command(vm)))
    if vm.queued:
      steps.append(Step('wait', queued_state_command(vm)))
    steps += [
      Step('copy', copy_repo_command(vm, job)),
      Step('install', ssh_command(vm, install_script(job))),
      *(Step('stage', argv) for argv in stage_commands(vm, job, where='workers')),
      Step('start', ssh_command(vm, start_script(job))),
    ]
  if not detach_only:
    steps += [Step('poll', status_command(vm, job, i)) for i in range(vm.workers)]
    steps.append(Step('tail', log_tail_command(vm, job, 0, log_lines)))
    steps += [Step('fetch', fetch_command(vm, job, i)) for i in range(vm.workers)]
    if delete_after:
      steps.append(Step('delete', delete_command(vm)))
  return steps


def check_modes(*, detach_only: bool, attach: bool, delete_after: bool) -> None:
  if detach_only and attach:
    raise ValueError('--detach_only starts a job and --attach polls one: pass one of them')
  if detach_only and delete_after:
    raise ValueError(
      '--detach_only with --delete_after would delete the VM under the running job: pass '
      '--delete_after to the later --attach instead'
    )
