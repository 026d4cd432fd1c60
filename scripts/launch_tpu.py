r"""Runs an experiment on a Cloud TPU VM or pod slice: create, copy, install, run, fetch, delete.

  python -m scripts.launch_tpu --name=specdec-v4-8 --zone=us-central2-b --accelerator_type=v4-8 \
      --dry_run
  python -m scripts.launch_tpu --name=specdec-v4-32 --zone=us-central2-b --accelerator_type=v4-32 \
      --project=my-project --delete_after

Run from the repo root, as every entry point here (`python -m scripts.<name>`).
The repo copied is the one this file lives in, whatever the working directory. Each step is one
gcloud command; --dry_run prints them, one per line, ready to paste into a shell, and runs nothing:

  1. create   `gcloud compute tpus tpu-vm create NAME --zone --accelerator-type --version`: a TPU
              VM (v4-8: 4 chips, 1 host) or a pod slice (v4-32: 16 chips, 4 hosts, "workers").
  2. copy     `tpu-vm scp --recurse` of the repo to `~/<--remote_dir>` on every worker. The
              working tree is copied as it is (.git and data/ included: ~130 MB here), into a
              directory that must not exist yet: the launcher always starts from a fresh VM.
  3. install  on every worker: the --apt_packages (Python 3.11: the package needs >= 3.11 and
              tpu-ubuntu2204-base ships 3.10), a venv `~/specdec_venv` made with --python, and
              `pip install -e . "jax[tpu]"` into it. Nothing is fetched from a model hub: the main
              job reads the shipped pair in pretrained/.
  4. run      --command on every worker (`tpu-vm ssh --worker=all`), in the repo with the venv
              active. On a pod slice every host must run the same program.
  5. fetch    --results_dir from worker 0 into --local_dir (made if missing): the results land in
              <local_dir>/<last component of results_dir>, e.g. /tmp/specdec_tpu/specdec_run.
  6. delete   with --delete_after, also when step 2, 3, 4 or 5 failed (never when create failed:
              the name may belong to someone else's VM).

Mesh. The code shards over a ('data', 'model') mesh (`specdec_jax/sharding.py`):
`sharding.make_mesh(data, model)` builds it over the first data * model devices of
`jax.devices()`; `sharding.shard_params(params, mesh)` places a T5's params by
`sharding.DEFAULT_RULES` (heads, MLP units and vocab over 'model'; `sharding.param_shardings` gives
the shardings alone); `sharding.shard_batch(batch, mesh)` splits the batch over 'data'; and
`with jax.set_mesh(mesh):` turns on the activation constraints (`sharding.constrain`) inside
models/t5.py. Each TPU v4 chip is one JAX device.
  v4-8 (4 chips, 1 host): `make_mesh(data=4, model=1)` for batch-parallel decoding (batch a
    multiple of 4), or `make_mesh(data=1, model=4)` to shard a large target over the 4 chips
    (batch 1, as in Leviathan et al.). An axis whose length the mesh axis does not divide (e.g.
    6 heads over model=4) stays replicated (`sharding.logical_to_mesh`).
  v4-32 (16 chips, 4 hosts): e.g. `make_mesh(data=4, model=4)` (4-way tensor parallelism, 4
    batch shards) or `make_mesh(data=16, model=1)` (pure batch parallelism).
  Multi-host runs must call `jax.distributed.initialize()` before anything else touches JAX;
  then `jax.devices()` lists all 16 chips, `make_mesh` spans the hosts, and every host must pass
  the same full batch to `shard_batch`. experiments/translate.py as shipped does neither: it
  decodes unsharded on the first device of each host, so on a pod slice each worker runs its own
  copy of the job and only worker 0's results come back.
"""

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
from collections.abc import Sequence

from absl import app, flags

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = (
  'python -m experiments.translate --config=experiments/configs/ende.py --workdir=/tmp/specdec_run'
)
VENV = '~/specdec_venv'  # Left unquoted in remote commands: the remote shell expands the ~.

_NAME = flags.DEFINE_string('name', None, 'TPU VM name (lowercase letters, digits, hyphens).')
_ZONE = flags.DEFINE_string('zone', None, 'Zone, e.g. us-central2-b (where v4 TPUs are).')
_ACCELERATOR_TYPE = flags.DEFINE_string('accelerator_type', 'v4-8', 'e.g. v4-8, v4-32.')
_VERSION = flags.DEFINE_string('version', 'tpu-ubuntu2204-base', 'TPU runtime (software) version.')
_PROJECT = flags.DEFINE_string('project', None, 'Google Cloud project; default: gcloud config.')
_COMMAND = flags.DEFINE_string('command', DEFAULT_COMMAND, 'Shell command run on every worker.')
_RESULTS_DIR = flags.DEFINE_string(
  'results_dir', '/tmp/specdec_run', 'Remote directory the command writes (fetched from worker 0).'
)
_LOCAL_DIR = flags.DEFINE_string('local_dir', '/tmp/specdec_tpu', 'Local directory to fetch into.')
_REMOTE_DIR = flags.DEFINE_string('remote_dir', 'specdec_jax', 'Repo copy, relative to remote ~.')
_PYTHON = flags.DEFINE_string('python', 'python3.11', 'Remote interpreter that makes the venv.')
_APT_PACKAGES = flags.DEFINE_list(
  'apt_packages', ['python3.11', 'python3.11-venv'], 'apt packages installed first; empty: none.'
)
_DELETE_AFTER = flags.DEFINE_bool('delete_after', False, 'Delete the TPU VM at the end.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the commands, one per line; run nothing.')


@dataclasses.dataclass(frozen=True)
class TpuVm:
  """A TPU VM or pod slice.

  Attributes:
    name: the VM's name: lowercase letters, digits and hyphens, starting with a letter.
    zone: e.g. 'us-central2-b'.
    accelerator_type: e.g. 'v4-8' (4 chips, 1 host) or 'v4-32' (16 chips, 4 hosts).
    version: the TPU runtime, e.g. 'tpu-ubuntu2204-base'.
    project: the Google Cloud project, or None for gcloud's configured one.
  """

  name: str
  zone: str
  accelerator_type: str = 'v4-8'
  version: str = 'tpu-ubuntu2204-base'
  project: str | None = None

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


@dataclasses.dataclass(frozen=True)
class Job:
  """What runs on the VM, and where its files go.

  Attributes:
    command: shell command run on every worker, in the repo copy with the venv active.
    results_dir: remote directory the command writes; fetched from worker 0.
    local_dir: local directory the results directory is copied into.
    repo_dir: local repo to copy.
    remote_dir: where the repo goes on each worker, relative to the remote home directory.
    python: remote interpreter that creates the venv (>= 3.11).
    apt_packages: installed with apt-get before the venv is made; empty installs nothing.
  """

  command: str = DEFAULT_COMMAND
  results_dir: str = '/tmp/specdec_run'
  local_dir: str = '/tmp/specdec_tpu'
  repo_dir: str = str(REPO_ROOT)
  remote_dir: str = 'specdec_jax'
  python: str = 'python3.11'
  apt_packages: tuple[str, ...] = ('python3.11', 'python3.11-venv')


def _gcloud(vm: TpuVm, verb: str, *args: str) -> list[str]:
  """`gcloud compute tpus tpu-vm <verb> <args>` in `vm`'s zone and project."""
  argv = ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, *args, f'--zone={vm.zone}']
  if vm.project:
    argv.append(f'--project={vm.project}')
  return argv


def create_command(vm: TpuVm) -> list[str]:
  """Creates the TPU VM or pod slice."""
  return _gcloud(
    vm, 'create', vm.name, f'--accelerator-type={vm.accelerator_type}', f'--version={vm.version}'
  )


def copy_repo_command(vm: TpuVm, job: Job) -> list[str]:
  """Copies the local repo to `job.remote_dir` on every worker."""
  return _gcloud(
    vm, 'scp', '--recurse', job.repo_dir, f'{vm.name}:{job.remote_dir}', '--worker=all'
  )


def ssh_command(vm: TpuVm, remote_command: str, worker: str = 'all') -> list[str]:
  """Runs the shell command `remote_command` on `worker` ('all', or an index as a string)."""
  return _gcloud(vm, 'ssh', vm.name, f'--worker={worker}', '--command', remote_command)


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


def run_script(job: Job) -> str:
  """The remote shell command that runs `job.command` in the repo copy with the venv active."""
  return f'cd {shlex.quote(job.remote_dir)} && . {VENV}/bin/activate && {job.command}'


def fetch_results_command(vm: TpuVm, job: Job) -> list[str]:
  """Copies `job.results_dir` from worker 0 into `job.local_dir`."""
  return _gcloud(
    vm, 'scp', '--recurse', f'{vm.name}:{job.results_dir}', job.local_dir, '--worker=0'
  )


def delete_command(vm: TpuVm) -> list[str]:
  """Deletes the TPU VM without asking."""
  return _gcloud(vm, 'delete', vm.name, '--quiet')


def job_commands(vm: TpuVm, job: Job) -> list[list[str]]:
  """The steps after create: copy, install, run, fetch."""
  return [
    copy_repo_command(vm, job),
    ssh_command(vm, install_script(job)),
    ssh_command(vm, run_script(job)),
    fetch_results_command(vm, job),
  ]


def all_commands(vm: TpuVm, job: Job, *, delete_after: bool) -> list[list[str]]:
  """Every command of a launch, in order: create, copy, install, run, fetch[, delete]."""
  commands = [create_command(vm), *job_commands(vm, job)]
  return commands + [delete_command(vm)] if delete_after else commands


def launch(vm: TpuVm, job: Job, *, delete_after: bool, dry_run: bool) -> None:
  """Runs the commands with `subprocess.run(check=True)`, or only prints them when `dry_run`.

  With `delete_after` the VM is deleted at the end, and also when a step after create fails, so
  a failed run does not leave a TPU running. Raises `subprocess.CalledProcessError` on failure.
  """
  if dry_run:
    for argv in all_commands(vm, job, delete_after=delete_after):
      print(shlex.join(argv))
    return
  _run(create_command(vm))
  try:
    os.makedirs(job.local_dir, exist_ok=True)
    for argv in job_commands(vm, job):
      _run(argv)
  finally:
    if delete_after:
      _run(delete_command(vm))


def _run(argv: Sequence[str]) -> None:
  print('+', shlex.join(argv), flush=True)
  subprocess.run(argv, check=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  try:
    vm = TpuVm(
      name=_NAME.value,
      zone=_ZONE.value,
      accelerator_type=_ACCELERATOR_TYPE.value,
      version=_VERSION.value,
      project=_PROJECT.value,
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  job = Job(
    command=_COMMAND.value,
    results_dir=_RESULTS_DIR.value,
    local_dir=_LOCAL_DIR.value,
    remote_dir=_REMOTE_DIR.value,
    python=_PYTHON.value,
    apt_packages=tuple(_APT_PACKAGES.value),
  )
  launch(vm, job, delete_after=_DELETE_AFTER.value, dry_run=_DRY_RUN.value)


if __name__ == '__main__':
  flags.mark_flags_as_required(['name', 'zone'])
  app.run(main)
