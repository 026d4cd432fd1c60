r"""Runs an experiment on a Cloud TPU VM or pod slice: create, copy, install, run detached, fetch.

The paper's configuration (Leviathan et al.: T5-XXL target, T5-small drafter) on a v4-8, as a spot
VM, detached, results fetched and the VM deleted at the end:

  CMD='python -m experiments.translate --config=experiments/configs/ende.py:paper'
  python -m scripts.launch_tpu --name=specdec-paper --zone=us-central2-b --accelerator_type=v4-8 \
      --spot --delete_after --env=JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache \
      --command="$CMD --workdir=/tmp/specdec_paper" --results_dir=/tmp/specdec_paper \
      --local_dir=/tmp/specdec_tpu --dry_run

Drop --dry_run to run it. The same through the queue (waits until the slice is granted), started
and left running; then, from any machine with gcloud, poll, fetch and delete later:

  python -m scripts.launch_tpu --name=specdec-paper --zone=us-central2-b --accelerator_type=v4-8 \
      --queued --spot --detach_only --command="$CMD --workdir=/tmp/specdec_paper" \
      --results_dir=/tmp/specdec_paper
  python -m scripts.launch_tpu --name=specdec-paper --zone=us-central2-b --accelerator_type=v4-8 \
      --queued --attach --delete_after --results_dir=/tmp/specdec_paper

Checkpoints on a local disk go to a bucket first (`--stage_checkpoint=/ckpt/t5_1_1_xxl
--stage_checkpoint_to=gs://my-bucket/t5_1_1_xxl`), or from a bucket onto each worker's disk
(`--stage_checkpoint=gs://my-bucket/t5_1_1_xxl --stage_checkpoint_to=/tmp/t5_1_1_xxl`).

Run from the repo root, as every entry point here (`python -m scripts.<name>`). The repo copied is
the one this file lives in, whatever the working directory. Each step is one gcloud command;
--dry_run prints them, one per line (a `#` line before the poll round), ready to paste into a
shell, and runs nothing. Remote paths are absolute or relative to the remote home (they are
quoted, so a leading ~ would not expand):

  stage     with --stage_checkpoint_to=gs://...: `gcloud storage cp -r SRC DST` here, before
            the VM exists (no TPU is billed while it uploads).
  create    `gcloud compute tpus tpu-vm create NAME --zone --accelerator-type --version [--spot]`:
            a TPU VM (v4-8: 4 chips, 1 host) or a pod slice (v4-32: 16 chips, 4 hosts,
            "workers"). With --queued: `gcloud compute tpus queued-resources create NAME-qr
            --node-id=NAME --accelerator-type --runtime-version [--spot]`, then `queued-resources
            describe NAME-qr --format='value(state.state)'` every --poll_interval seconds until
            ACTIVE (FAILED, SUSPENDING or SUSPENDED: an error).
  copy      `tpu-vm scp --recurse` of the repo to `~/<--remote_dir>` on every worker. The
            working tree is copied as it is (.git and data/ included), into a directory that must
            not exist yet: the launcher always starts from a fresh VM.
  install   on every worker: the --apt_packages (Python 3.11: the package needs >= 3.11 and
            tpu-ubuntu2204-base ships 3.10), a venv `~/specdec_venv` made with --python, and
            `pip install -e . "jax[tpu]"` into it.
  stage     with --stage_checkpoint=gs://... and a path as --stage_checkpoint_to: `gcloud
            storage cp -r` on every worker, onto its own disk (a destination that exists
            already receives the copy inside it, as DST/<last component of SRC>).
  start     on every worker: writes `~/<--job_dir>/run.sh` (cd to the repo, the venv, `export`
            of each --env, --command) and starts it under `nohup setsid`, so a dropped ssh does
            not kill the job; its output goes to `<job_dir>/log` on that worker, and when it ends
            its exit status goes to `<job_dir>/status`. The ssh returns at once.
  poll      every --poll_interval seconds, `cat <job_dir>/status` on each worker not yet finished,
            then the last --log_lines lines of worker 0's log, until every worker has a status.
  fetch     for each worker i: --results_dir and the job directory (run.sh, log, status) into
            `<--local_dir>/worker_<i>/`, e.g. /tmp/specdec_tpu/worker_0/specdec_run. The start
            step makes --results_dir on every worker, so a worker the job wrote nothing on gives
            an empty directory, not a failed copy.
  delete    with --delete_after, also when a step after create failed or was interrupted (never
            when create failed: the name may belong to someone else's VM); with --queued
            `queued-resources delete NAME-qr --force`, which deletes the VM too.

The run fails (after the fetch) when any worker's job exited non-zero; --detach_only stops after
start and prints the --attach command that polls, fetches and (with --delete_after) deletes.

Workers. Poll and fetch address each worker of the slice (`--worker=i`); how many there are
follows from the accelerator type (`num_workers`), or --num_workers for any other type.

Mesh. The code shards over a ('data', 'model') mesh (`specdec_jax/sharding.py`):
`sharding.make_mesh(data, model)` builds it over the first data * model devices of
`jax.devices()`; `sharding.shard_params(params, mesh)` places a T5's params by
`sharding.DEFAULT_RULES` (heads, MLP units and vocab over 'model'); `sharding.shard_batch(batch,
mesh)` splits the batch over 'data'; and `with jax.set_mesh(mesh):` turns on the activation
constraints inside models/t5.py. Each TPU v4 chip is one JAX device.
  v4-8 (4 chips, 1 host): `make_mesh(data=1, model=4)` shards a large target over the 4 chips
    (batch 1, as in Leviathan et al.), `make_mesh(data=4, model=1)` decodes batch-parallel.
  v4-32 (16 chips, 4 hosts): e.g. `make_mesh(data=4, model=4)`. Every host runs the same
    program (the launcher starts --command on every worker); on a Cloud TPU VM JAX finds the
    other hosts itself, and then `jax.devices()` lists all 16 chips.
"""

import dataclasses
import os
import pathlib
import posixpath
import re
import shlex
import subprocess
import time
from collections.abc import Sequence

from absl import app, flags

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = (
  'python -m experiments.translate --config=experiments/configs/ende.py --workdir=/tmp/specdec_run'
)
VENV = '~/specdec_venv'  # Left unquoted in remote commands: the remote shell expands the ~.
# Consecutive poll rounds in which an ssh failed before the launcher gives up (at 60 s a round:
# 10 minutes without reaching a worker, e.g. a spot VM that was preempted).
MAX_POLL_FAILURES = 10
# Queued-resource states that will never become ACTIVE.
QUEUED_FAILED_STATES = ('FAILED', 'SUSPENDING', 'SUSPENDED')

_NAME = flags.DEFINE_string('name', None, 'TPU VM name (lowercase letters, digits, hyphens).')
_ZONE = flags.DEFINE_string('zone', None, 'Zone, e.g. us-central2-b (where v4 TPUs are).')
_ACCELERATOR_TYPE = flags.DEFINE_string('accelerator_type', 'v4-8', 'e.g. v4-8, v4-32.')
_VERSION = flags.DEFINE_string('version', 'tpu-ubuntu2204-base', 'TPU runtime (software) version.')
_PROJECT = flags.DEFINE_string('project', None, 'Google Cloud project; default: gcloud config.')
_SPOT = flags.DEFINE_bool('spot', False, 'A spot TPU (cheaper; may be preempted).')
_QUEUED = flags.DEFINE_bool(
  'queued', False, 'Create through a queued resource named NAME-qr and wait until ACTIVE.'
)
_NUM_WORKERS = flags.DEFINE_integer(
  'num_workers', None, 'Hosts of the slice; default: from --accelerator_type (v4, v5p, v5litepod).'
)
_COMMAND = flags.DEFINE_string('command', DEFAULT_COMMAND, 'Shell command run on every worker.')
_ENV = flags.DEFINE_multi_string(
  'env', [], 'KEY=VALUE exported to --command on every worker; repeatable.'
)
_RESULTS_DIR = flags.DEFINE_string(
  'results_dir', '/tmp/specdec_run', 'Remote directory the command writes (fetched per worker).'
)
_LOCAL_DIR = flags.DEFINE_string('local_dir', '/tmp/specdec_tpu', 'Local directory to fetch into.')
_REMOTE_DIR = flags.DEFINE_string('remote_dir', 'specdec_jax', 'Repo copy, relative to remote ~.')
_JOB_DIR = flags.DEFINE_string(
  'job_dir', 'specdec_job', "Remote directory of the job's run.sh, log and status, relative to ~."
)
_PYTHON = flags.DEFINE_string('python', 'python3.11', 'Remote interpreter that makes the venv.')
_APT_PACKAGES = flags.DEFINE_list(
  'apt_packages', ['python3.11', 'python3.11-venv'], 'apt packages installed first; empty: none.'
)
_STAGE_CHECKPOINT = flags.DEFINE_string(
  'stage_checkpoint', None, 'Checkpoint to copy with `gcloud storage cp -r` (a path or gs://).'
)
_STAGE_CHECKPOINT_TO = flags.DEFINE_string(
  'stage_checkpoint_to', None, "Where to: gs://..., or a path on each worker's disk."
)
_POLL_INTERVAL = flags.DEFINE_integer('poll_interval', 60, 'Seconds between polls.')
_LOG_LINES = flags.DEFINE_integer('log_lines', 20, 'Lines of the log printed at each poll.')
_DETACH_ONLY = flags.DEFINE_bool(
  'detach_only', False, 'Start the job and return; poll and fetch later with --attach.'
)
_ATTACH = flags.DEFINE_bool(
  'attach', False, 'Poll and fetch a job started earlier (e.g. with --detach_only); no create.'
)
_DELETE_AFTER = flags.DEFINE_bool('delete_after', False, 'Delete the TPU VM at the end.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the commands, one per line; run nothing.')


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
  _check_modes(detach_only=detach_only, attach=attach, delete_after=delete_after)
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


def _check_modes(*, detach_only: bool, attach: bool, delete_after: bool) -> None:
  if detach_only and attach:
    raise ValueError('--detach_only starts a job and --attach polls one: pass one of them')
  if detach_only and delete_after:
    raise ValueError(
      '--detach_only with --delete_after would delete the VM under the running job: pass '
      '--delete_after to the later --attach instead'
    )


class JobFailedError(RuntimeError):
  """The job exited non-zero on some worker."""


def launch(
  vm: TpuVm,
  job: Job,
  *,
  delete_after: bool,
  dry_run: bool,
  detach_only: bool = False,
  attach: bool = False,
  poll_interval: float = 60,
  log_lines: int = 20,
) -> None:
  """Runs the commands of `plan`, or only prints them when `dry_run`.

  With `delete_after` the VM is deleted at the end, and also when a step after create fails or
  is interrupted, so a failed run does not leave a TPU running.

  Raises:
    subprocess.CalledProcessError: a gcloud command before the poll failed.
    JobFailedError: the job exited non-zero on some worker (after the fetch).
    RuntimeError: the queued resource failed, no worker answered `MAX_POLL_FAILURES` polls,
      or a worker's fetch failed (the others are fetched; --attach fetches again).
  """
  steps = plan(
    vm,
    job,
    delete_after=delete_after,
    detach_only=detach_only,
    attach=attach,
    log_lines=log_lines,
  )
  if dry_run:
    for i, step in enumerate(steps):
      if step.what == 'poll' and (i == 0 or steps[i - 1].what != 'poll'):
        print(f'# every {poll_interval} s until each worker has written {job.status_file}:')
      print(shlex.join(step.argv))
    return
  if not attach:
    for argv in stage_commands(vm, job, where='local'):
      _run(argv)
    _run(create_command(vm))
  try:
    if not attach:
      if vm.queued:
        _wait_until_active(vm, poll_interval)
      _run(copy_repo_command(vm, job))
      _run(ssh_command(vm, install_script(job)))
      for argv in stage_commands(vm, job, where='workers'):
        _run(argv)
      _run(ssh_command(vm, start_script(job)))
      if detach_only:
        print('Started. Poll and fetch later with:', shlex.join(_attach_argv(vm, job)))
        return
    statuses = _wait_for_job(vm, job, poll_interval, log_lines)
    unfetched = _fetch_all(vm, job)
    failed = {i: status for i, status in statuses.items() if status != 0}
    for i in failed:
      try:
        _run(log_tail_command(vm, job, i, log_lines))
      except subprocess.CalledProcessError:
        pass  # the fetched log, if any, says the same
    retry = f'fetch failed on workers {unfetched}: fetch again with --attach'
    if failed:
      log = f'{job.local_dir}/worker_<i>/{posixpath.basename(job.job_dir)}/log'
      raise JobFailedError(
        f'the job failed on workers {sorted(failed)} (exit status {failed}); their logs are in '
        f'{log}' + (f'; {retry}' if unfetched else '')
      )
    if unfetched:
      raise RuntimeError(f'the job succeeded but {retry}')
  finally:
    if delete_after:
      _run(delete_command(vm))


def _wait_until_active(vm: TpuVm, poll_interval: float) -> None:
  while True:
    state = _output(queued_state_command(vm)).strip()
    print(f'queued resource {vm.queued_resource}: {state}', flush=True)
    if state == 'ACTIVE':
      return
    if state in QUEUED_FAILED_STATES:
      raise RuntimeError(
        f'queued resource {vm.queued_resource} is {state}: see `gcloud compute tpus '
        f'queued-resources describe {vm.queued_resource} --zone={vm.zone}`'
      )
    time.sleep(poll_interval)


def _wait_for_job(vm: TpuVm, job: Job, poll_interval: float, log_lines: int) -> dict[int, int]:
  """Polls every worker's status file until each has one; returns {worker: exit status}."""
  statuses: dict[int, int] = {}
  failed_rounds = 0
  while True:
    failed = False
    for i in range(vm.workers):
      if i in statuses:
        continue
      try:
        text = _output(status_command(vm, job, i)).strip()
      except subprocess.CalledProcessError as e:
        print(f'poll of worker {i} failed (exit status {e.returncode}); retrying', flush=True)
        failed = True
        continue
      if text:
        if not re.fullmatch(r'-?\d+', text):
          raise RuntimeError(f'worker {i} wrote {text!r} to {job.status_file}, not an exit status')
        statuses[i] = int(text)
    try:
      _run(log_tail_command(vm, job, 0, log_lines))
    except subprocess.CalledProcessError:
      failed = True
    failed_rounds = failed_rounds + 1 if failed else 0
    if failed_rounds >= MAX_POLL_FAILURES:
      raise RuntimeError(
        f'{MAX_POLL_FAILURES} poll rounds in a row could not reach a worker of {vm.name} '
        '(preempted or deleted?)'
      )
    print(f'finished: {len(statuses)}/{vm.workers} workers {statuses}', flush=True)
    if len(statuses) == vm.workers:
      return statuses
    time.sleep(poll_interval)


def _fetch_all(vm: TpuVm, job: Job) -> list[int]:
  """Fetches every worker, also after one failed; returns the workers whose fetch failed."""
  unfetched = []
  for i in range(vm.workers):
    os.makedirs(worker_dir(job, i), exist_ok=True)
    try:
      _run(fetch_command(vm, job, i))
    except subprocess.CalledProcessError:
      unfetched.append(i)
  return unfetched


def _attach_argv(vm: TpuVm, job: Job) -> list[str]:
  """The command line that polls and fetches this job later."""
  argv = [
    'python',
    '-m',
    'scripts.launch_tpu',
    '--attach',
    f'--name={vm.name}',
    f'--zone={vm.zone}',
    f'--accelerator_type={vm.accelerator_type}',
    f'--num_workers={vm.workers}',
    f'--results_dir={job.results_dir}',
    f'--job_dir={job.job_dir}',
    f'--local_dir={job.local_dir}',
  ]
  argv += [f'--project={vm.project}'] if vm.project else []
  return argv + (['--queued'] if vm.queued else [])


def _run(argv: Sequence[str]) -> None:
  print('+', shlex.join(argv), flush=True)
  subprocess.run(argv, check=True)


def _output(argv: Sequence[str]) -> str:
  """Runs `argv` and returns its stdout (stderr passes through)."""
  return subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _POLL_INTERVAL.value < 1 or _LOG_LINES.value < 1:
    raise app.UsageError(
      f'--poll_interval and --log_lines must be at least 1, got {_POLL_INTERVAL.value} and '
      f'{_LOG_LINES.value}'
    )
  try:
    vm = TpuVm(
      name=_NAME.value,
      zone=_ZONE.value,
      accelerator_type=_ACCELERATOR_TYPE.value,
      version=_VERSION.value,
      project=_PROJECT.value,
      spot=_SPOT.value,
      queued=_QUEUED.value,
      workers=_NUM_WORKERS.value,
    )
    job = Job(
      command=_COMMAND.value,
      env=parse_env(_ENV.value),
      results_dir=_RESULTS_DIR.value,
      local_dir=_LOCAL_DIR.value,
      remote_dir=_REMOTE_DIR.value,
      job_dir=_JOB_DIR.value,
      python=_PYTHON.value,
      apt_packages=tuple(_APT_PACKAGES.value),
      checkpoint=_STAGE_CHECKPOINT.value,
      checkpoint_to=_STAGE_CHECKPOINT_TO.value,
    )
    _check_modes(
      detach_only=_DETACH_ONLY.value, attach=_ATTACH.value, delete_after=_DELETE_AFTER.value
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  launch(
    vm,
    job,
    delete_after=_DELETE_AFTER.value,
    dry_run=_DRY_RUN.value,
    detach_only=_DETACH_ONLY.value,
    attach=_ATTACH.value,
    poll_interval=_POLL_INTERVAL.value,
    log_lines=_LOG_LINES.value,
  )


if __name__ == '__main__':
  flags.mark_flags_as_required(['name', 'zone'])
  app.run(main)
