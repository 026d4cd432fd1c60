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

The commands and remote scripts are built in `scripts/tpu_commands.py` (pure functions, no
flags); this file reads the flags and runs them. Run from the repo root, as every entry point here
(`python -m scripts.<name>`). The repo copied is
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
`jax.devices()`; `sharding.param_shardings(params, mesh)` places a T5's params by
`sharding.DEFAULT_RULES` (heads, MLP units and vocab over 'model'); `sharding.global_batch`
splits the batch over 'data', each host building its own rows; and `with jax.set_mesh(mesh):` turns on the activation
constraints inside models/t5_layers.py. Each TPU v4 chip is one JAX device.
  v4-8 (4 chips, 1 host): `make_mesh(data=1, model=4)` shards a large target over the 4 chips
    (batch 1, as in Leviathan et al.), `make_mesh(data=4, model=1)` decodes batch-parallel.
  v4-32 (16 chips, 4 hosts): e.g. `make_mesh(data=4, model=4)`. Every host runs the same
    program (the launcher starts --command on every worker); on a Cloud TPU VM JAX finds the
    other hosts itself, and then `jax.devices()` lists all 16 chips.
"""

import os
import posixpath
import re
import shlex
import subprocess
import time
from collections.abc import Sequence

from absl import app, flags

from scripts.tpu_commands import (
  DEFAULT_COMMAND,
  Job,
  TpuVm,
  check_modes,
  copy_repo_command,
  create_command,
  delete_command,
  fetch_command,
  install_script,
  log_tail_command,
  parse_env,
  plan,
  queued_state_command,
  ssh_command,
  stage_commands,
  start_script,
  status_command,
  worker_dir,
)

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
    check_modes(
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
