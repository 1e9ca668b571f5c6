"""Run nvFuser's own Python tests against pyfuser and print pass / fail counts per file.

    python scripts/nvfuser_tests.py /path/to/Fuser [--files test_repro.py ...] [--multidevice] [-k EXPR]

``/path/to/Fuser`` is a checkout of NVIDIA/Fuser (only ``tests/python`` is read; nothing of it is
copied here). The tests run unmodified; the harness only sets up their environment:

- ``nvfuser_direct`` is pyfuser, through pyfuser's documented alias (``pyfuser.install_nvfuser_alias()``:
  renames and re-exports, ``nvfuser_direct.X`` is ``pyfuser.X``);
- on a machine without a GPU, CUDA tensors are CPU tensors: a torch function mode rewrites
  ``device="cuda"`` (keywords, ``Tensor.to("cuda")``, ``Tensor.cuda()``) to the CPU, and the few
  ``torch.cuda`` queries the tests make for gating (device properties and capability, current device,
  count, synchronize, the RNG state) answer as one Hopper GPU would. CUDA streams, cudart and nvFuser's
  CUTLASS kernels are not emulated: tests that use them count as "needs a GPU", as do tests sized
  for a GPU, which an address-space limit per test process (``--memory-gb``) and a time limit per
  test (``--test-timeout``) stop before they exhaust the host;
- on a GPU machine the tests run as written; ``--workers N`` runs the direct files in one pytest of N
  pytest-xdist processes, spread over the GPUs (one GPU each), and the multidevice files in one torchrun
  (``--timeout`` is then per run);
- otherwise direct tests run one pytest per file (a timeout per file); multidevice files run under
  ``torchrun --nproc-per-node 2``, their NCCL process groups on gloo (``--multidevice``).
  ``test_high_complexity.py`` runs only when named (``--files``): over 10 minutes on 2 CPU cores;
- a test stopped by pyfuser's ``UnsupportedFeatureError`` (a feature of nvFuser's CUDA code generator
  that pyfuser refuses where it is asked, e.g. TMA copies) counts as "n/a", apart from the pass rate.

nvFuser's test helpers import ``looseversion`` and ``expecttest``: install them first.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

# Loaded by pytest (``-p nvfuser_cpu_env``) before nvFuser's conftest files import nvfuser_direct.
PLUGIN = '''
import json
import os
import resource
import signal
import types

# pytest-xdist workers on a machine of several GPUs: one GPU each, in turn (before torch reads the variable)
_gpus = int(os.environ.get("NVFUSER_TESTS_GPUS", "0"))
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _gpus > 1 and _worker.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_worker[2:]) % _gpus)

import pytest

import torch
from torch.overrides import TorchFunctionMode

import pyfuser

pyfuser.install_nvfuser_alias()

_limit = int(os.environ.get("NVFUSER_TESTS_MEMORY_BYTES", "0"))
# A test sized for an 80 GB GPU fails with an allocation error instead of exhausting the host (not on a
# GPU machine: a CUDA context reserves more address space than any such limit).
if _limit and not torch.cuda.is_available():
    resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))


_test_timeout = int(os.environ.get("NVFUSER_TESTS_TEST_TIMEOUT", "0"))


def _out_of_time(signum, frame):
    raise TimeoutError(f"test ran over {_test_timeout} s on this machine (--test-timeout)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test sized for a GPU that would run for many minutes on a CPU stops at the limit."""
    if _test_timeout:
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.alarm(_test_timeout)
    try:
        yield
    finally:
        signal.alarm(0)


def pytest_runtest_logreport(report):
    """One line per test as it finishes, so a run cut short still counts what it ran."""
    if report.when == "call" or report.outcome != "passed":
        message = ""
        if report.outcome != "passed":
            message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else message
        outcome = report.outcome if report.when == "call" or report.outcome == "skipped" else "error"
        record = {"id": report.nodeid, "outcome": outcome, "message": message,
                  "text": str(report.longrepr)[-2000:] if report.outcome == "failed" else ""}
        with open(os.environ["NVFUSER_TESTS_LOG"], "a") as log:
            log.write(json.dumps(record) + "\\n")


def pytest_collectreport(report):
    if report.failed:
        record = {"id": report.nodeid + "::<collection>", "outcome": "error",
                  "message": str(report.longrepr).strip().splitlines()[-1], "text": str(report.longrepr)[-2000:]}
        with open(os.environ["NVFUSER_TESTS_LOG"], "a") as log:
            log.write(json.dumps(record) + "\\n")

_init_process_group = torch.distributed.init_process_group


def _harness_process_group(*args, **kwargs):
    """Under torchrun, a fixed ``tcp://`` rendezvous (nvFuser's fixture names localhost:29500) is
    torchrun's own store: with torchrun's agent store the ranks only connect as clients, and nothing
    listens at 29500 when torchrun picked its port (--standalone), so they would wait for 30 minutes.
    On a machine without a GPU, NCCL process groups run on gloo."""
    init_method = kwargs.get("init_method")
    if isinstance(init_method, str) and init_method.startswith("tcp://") and "MASTER_PORT" in os.environ:
        kwargs["init_method"] = f"tcp://{os.environ.get('MASTER_ADDR', 'localhost')}:{os.environ['MASTER_PORT']}"
    if not torch.cuda.is_available():
        kwargs.pop("device_id", None)
        if kwargs.get("backend") == "nccl":
            kwargs["backend"] = "gloo"
    return _init_process_group(*args, **kwargs)


torch.distributed.init_process_group = _harness_process_group

if not torch.cuda.is_available():
    def _cpu(device):
        if isinstance(device, str) and device.startswith("cuda"):
            return "cpu"
        if isinstance(device, torch.device) and device.type == "cuda":
            return torch.device("cpu")
        if isinstance(device, int) and not isinstance(device, bool):
            return "cpu"
        return device

    class _CudaOnCpu(TorchFunctionMode):
        """device="cuda" anywhere in torch's API means the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            if func is torch.Tensor.to:
                args = (args[0], *(_cpu(a) for a in args[1:]))
            return func(*args, **kwargs)

    _CudaOnCpu().__enter__()

    _props = types.SimpleNamespace(name="CPU standing in for a Hopper GPU", major=9, minor=0,
                                   total_memory=80 << 30, multi_processor_count=132)
    torch.cuda.get_device_properties = lambda *a, **k: _props
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

'''

# Failures that are the machine's, not pyfuser's: counted apart, as "needs a GPU" (CUDA-only APIs, and
# tests sized for a GPU's memory that the --memory-gb limit stops; "No available kernel" is torch's own
# attention refusing a reference the tests compute with CUDA's flash kernel, e.g. with dropout).
GPU_ONLY = re.compile(r"Torch not compiled with CUDA|cudart|nvf_cutlass|No CUDA GPUs|CUDA driver|"
                      r"torch\.cuda\.(Stream|Event)|Found no NVIDIA driver|nccl|"
                      r"DefaultCPUAllocator: can't allocate memory|with arguments from the 'CPU' backend|"
                      r"on this machine \(--test-timeout\)|No available kernel\.  Aborting execution",
                      re.IGNORECASE)

# Failures where pyfuser refuses, by design and at the line that asks, a feature of nvFuser's CUDA code
# generator or of GPU hardware that Triton kernels do not express (``UnsupportedFeatureError``: TMA bulk
# copies, ldmatrix, ...): counted apart as "n/a", listed with their causes, and out of the pass rate.
UNSUPPORTED = re.compile(r"UnsupportedFeatureError: pyfuser does not implement")

DIRECT_SKIP = {"test_high_complexity.py": "over 10 minutes on a 2-core CPU machine (--files runs it)"}


def write_env(tmp: Path, checkout: Path) -> dict[str, str]:
    (tmp / "nvfuser_cpu_env.py").write_text(textwrap.dedent(PLUGIN))
    (tmp / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    paths = [str(tmp), str(checkout / "tests"), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def pytest_args(tmp: Path, checkout: Path, tests: list[Path], k: str | None, workers: int = 0) -> list[str]:
    args = ["-m", "pytest", *map(str, tests), "-p", "nvfuser_cpu_env", "-c", str(tmp / "pytest.ini"),
            "--rootdir", str(checkout), "--confcutdir", str(checkout / "tests"), "-p", "no:cacheprovider",
            "-q", "--no-header", "-rN", "--continue-on-collection-errors"]  # a file that fails to import: its own count
    return args + (["-k", k] if k else []) + (["-n", str(workers)] if workers > 1 else [])


def read_results(log: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, first line of the message) per test the plugin logged (rank 0's)."""
    if not log.exists():
        return []
    results: dict[str, tuple[str, str]] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        outcome, message = record["outcome"], record["message"]
        if outcome in ("failed", "error") and GPU_ONLY.search(f"{message}\n{record['text']}"):
            outcome = "gpu"
        elif outcome in ("failed", "error") and UNSUPPORTED.search(f"{message}\n{record['text']}"):
            outcome = "n/a"
        if record["id"] not in results or results[record["id"]][0] == "passed":  # a teardown error counts
            results[record["id"]] = (outcome, message.strip().splitlines()[0][:160] if message.strip() else "")
    return [(test_id, outcome, message) for test_id, (outcome, message) in results.items()]


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (read from /proc), children first."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def run_files(tmp: Path, checkout: Path, env: dict[str, str], tests: list[Path], nproc: int, timeout: int,
              k: str | None, workers: int = 0) -> tuple[list[tuple[str, str, str]], str]:
    """Run ``tests`` in one pytest (under torchrun for ``nproc`` > 1; ``workers`` xdist processes)."""
    args = pytest_args(tmp, checkout, tests, k, workers if nproc == 1 else 0)
    log = tmp / f"{tests[0].parent.name}_{tests[0].stem}.rank0.jsonl"
    env = dict(env, NVFUSER_TESTS_LOG=str(log).replace(".rank0.", ".rank${RANK}."))
    if nproc > 1:
        # Every rank runs every test and logs its own results; rank 0's are read.
        per_rank = f'NVFUSER_TESTS_LOG="{env["NVFUSER_TESTS_LOG"]}" exec "$0" "$@"'
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
               "--no-python", "bash", "-c", per_rank, sys.executable, *args]
    else:
        env["NVFUSER_TESTS_LOG"] = str(log)
        cmd = [sys.executable, *args]
    # A session of its own: on a timeout every rank torchrun started goes too (a rank left behind
    # would keep the rendezvous port of the next file's process group).
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            _, stderr = proc.communicate(timeout=timeout)
            note = "" if proc.returncode in (0, 1, 2) else f"exit {proc.returncode}: {stderr.strip()[-200:]}"
        except subprocess.TimeoutExpired:
            # torchrun starts each rank in a process group of its own: kill them all, or a hung rank keeps
            # the output pipes (and the next file's rendezvous) open.
            for pid in [proc.pid, *_descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.communicate()
            note = f"timed out after {timeout} s"
    return read_results(log), note


def print_file(test: Path, results: list[tuple[str, str, str]], note: str, totals: collections.Counter[str],
               causes: collections.Counter[str], unsupported: collections.Counter[str], verbose: bool) -> None:
    """One file's row of counts (adding them to ``totals``), its failures by message."""
    counts = collections.Counter(outcome for _, outcome, _ in results)
    counts["failed"] += counts.pop("error", 0)
    totals.update(counts)
    label = f"{test.parent.name}/{test.name}"
    print(f"{label:42} {counts['passed']:5} {counts['failed']:5} {counts['gpu']:5} {counts['skipped']:5}"
          f" {counts['n/a']:5}{'  ' + note if note else ''}", flush=True)
    for test_id, outcome, message in results:
        if outcome in ("failed", "error"):
            causes[re.sub(r"T\d+_g|0x[0-9a-f]+|\d+", "#", message)[:110]] += 1
            if verbose:
                print(f"    FAIL {test_id.split('.')[-1]}: {message}")
        elif outcome == "n/a":
            unsupported[re.sub(r"T\d+|\d+", "#", message.split("does not implement ")[-1])[:110]] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a checkout of NVIDIA/Fuser")
    parser.add_argument("--files", nargs="*", help="file names under tests/python/direct or multidevice")
    parser.add_argument("--multidevice", action="store_true", help="also run tests/python/multidevice (torchrun)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks for multidevice files")
    parser.add_argument("--timeout", type=int, default=2400, help="seconds per file")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--memory-gb", type=float, default=10.0,
                        help="address-space limit of each test process (tests sized for an 80 GB GPU then fail "
                             "instead of exhausting the host); 0: none")
    parser.add_argument("--test-timeout", type=int, default=180,
                        help="seconds one test may run (GPU-sized tests crawl on a CPU); 0: none")
    parser.add_argument("--workers", type=int, default=0,
                        help="run the direct files in one pytest of N xdist processes and the multidevice files in "
                             "one torchrun (a GPU machine)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failing test")
    opts = parser.parse_args()
    tests = opts.checkout.resolve() / "tests" / "python"
    files = [(p, 1) for p in sorted((tests / "direct").glob("test_*.py"))]
    if opts.multidevice:
        files += [(p, opts.nproc) for p in sorted((tests / "multidevice").glob("test_*.py"))]
    if opts.files:
        files = [(p, n) for p, n in files if p.name in opts.files or f"{p.parent.name}/{p.name}" in opts.files]
        if opts.multidevice is False:
            files += [(p, opts.nproc) for p in sorted((tests / "multidevice").glob("test_*.py"))
                      if f"multidevice/{p.name}" in opts.files]
    else:
        files = [(p, n) for p, n in files if p.name not in DIRECT_SKIP or n > 1]
        for name, why in DIRECT_SKIP.items():
            print(f"skipped direct/{name}: {why}")
    totals: collections.Counter[str] = collections.Counter()
    causes: collections.Counter[str] = collections.Counter()
    unsupported: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="nvfuser_tests_") as name:
        tmp = Path(name)
        env = write_env(tmp, opts.checkout.resolve())
        env["NVFUSER_TESTS_MEMORY_BYTES"] = str(int(opts.memory_gb * (1 << 30)))
        env["NVFUSER_TESTS_TEST_TIMEOUT"] = str(opts.test_timeout)
        print(f"{'file':42} {'pass':>5} {'fail':>5} {'gpu':>5} {'skip':>5} {'n/a':>5}")
        env["NVFUSER_TESTS_GPUS"] = str(torch.cuda.device_count()) if torch.cuda.is_available() else "0"
        if opts.workers > 1:  # one pytest for the direct files, one torchrun for the multidevice ones
            batches = [([t for t, n in files if n == k], k) for k in sorted({n for _, n in files})]
        else:
            batches = [([t], n) for t, n in files]
        for tests, nproc in batches:
            results, note = run_files(tmp, opts.checkout.resolve(), env, tests, nproc, opts.timeout, opts.k,
                                      opts.workers)
            for test in tests:
                mine = [r for r in results if r[0].split("::")[0].endswith(f"{test.parent.name}/{test.name}")]
                print_file(test, mine, note, totals, causes, unsupported, opts.verbose)
    ran = totals["passed"] + totals["failed"]
    share = f" ({100 * totals['passed'] / ran:.1f}%)" if ran else ""
    print(f"{'total':42} {totals['passed']:5} {totals['failed']:5} {totals['gpu']:5} {totals['skipped']:5}"
          f" {totals['n/a']:5}   passed {totals['passed']} of {ran} that ran on this machine{share}")
    if unsupported:
        print("n/a (pyfuser does not implement, by design):")
        for message, count in unsupported.most_common():
            print(f"  {count:4}  {message}")
    if causes:
        print("failures by message:")
        for message, count in causes.most_common():
            print(f"  {count:4}  {message}")
    return 0 if totals["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
