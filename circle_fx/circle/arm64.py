"""onert's aarch64 build (the devices' CPU), run from an x86 host under qemu-user.

ONE's users run onert on ARM; its aarch64 kernels (hybrid FC, ggml, ROPE, uint8) are other code
than the x86 wheel's, so a file that is right on x86 is not known right on ARM until it ran
there. :class:`Arm64Runtime` is a runtime with the interface of the local one: ``session(path)``
gives an object with :class:`~circle_fx.circle.runtime.OnertSession`'s ``run(inputs)``, and
``bound_session(path)`` one with the LLM runner's ``bind`` / ``run`` / ``output``; so
``CircleModel.run(x, runtime=arm)`` and ``LLMRunner(package, runtime=arm)`` run on arm64 with
their own logic, not a copy. Behind it is one persistent worker (:mod:`.arm64_worker`) in the
aarch64 Python, spoken to by pickle over pipes; files are shared by path (qemu-user sees the
host's file system).

The arm64 side (:class:`Arm64Env`) is built once and cached, keyed by versions, under
``$CIRCLE_FX_ARM64_CACHE`` or ``~/.cache/circle_fx/arm64``: a Debian arm64 root unpacked by
debootstrap's first stage (``--foreign``: nothing runs, so no binfmt_misc is needed) and
``dpkg-deb -x``, and the aarch64 wheels of onert and numpy (the host's versions) from PyPI,
unzipped into a site directory. Measured on the dev VM: ~30 s, ~300 MB. ``scripts/arm64.py
setup`` builds it; ``python -m circle_fx.circle.arm64 setup`` does the same without the project's scripts.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from ..errors import RuntimeFailure
from .runtime import check_loadable

SUITE = "bookworm"  # Debian 12: its python3.11 matches the cp311 wheels
PY = "3.11"
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
QEMU_NAMES = ("qemu-aarch64-static", "qemu-aarch64")
APT_PACKAGES = ("qemu-user-static", "debootstrap")


class Arm64Unavailable(RuntimeFailure):
    """The arm64 side cannot be used here (no qemu, no cached root and no way to build one...)."""


def _host_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise Arm64Unavailable(f"{dist} is not installed on the host: the arm64 side uses the host's version") from None


def find_qemu() -> str | None:
    for name in QEMU_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _mirror() -> str:
    """The Debian mirror apt already uses (deb822 or one-line sources), else deb.debian.org."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            for line in open(path):
                words = line.split()
                if words[:1] == ["URIs:"] and len(words) > 1:
                    return words[1]
                if words[:1] == ["deb"] and len(words) > 2:
                    return next(w for w in words[1:] if "://" in w)
        except (OSError, StopIteration):
            continue
    return "http://deb.debian.org/debian"


class Arm64Env:
    """The cached arm64 root + site of one version key; :meth:`ensure` builds what is missing."""

    def __init__(self, cache: str | None = None, versions: dict | None = None):
        self.versions = versions or {"onert": _host_version("onert"), "numpy": _host_version("numpy")}
        base = cache or os.environ.get("CIRCLE_FX_ARM64_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "circle_fx", "arm64")
        self.key = f"debian-{SUITE}-py{PY}-" + "-".join(f"{k}{v}" for k, v in sorted(self.versions.items()))
        self.dir = os.path.join(base, self.key)
        self.root, self.site = os.path.join(self.dir, "root"), os.path.join(self.dir, "site")
        self.python = os.path.join(self.root, "usr", "bin", f"python{PY}")
        self.stamp = os.path.join(self.dir, "ready.json")

    @property
    def ready(self) -> bool:
        return os.path.exists(self.stamp)

    def missing(self) -> str | None:
        """Why the arm64 side cannot run here now (None: it can), without building anything."""
        if find_qemu() is None:
            return f"qemu-user is not installed ({' or '.join(QEMU_NAMES)} not on PATH; apt-get install qemu-user-static)"
        if not self.ready:
            return f"the arm64 root is not built ({self.dir}); run `python scripts/arm64.py setup` (~1 min)"
        return None

    def ensure(self, install: bool = False, log=None) -> "Arm64Env":
        """Build the root and site if not cached. ``install``: apt-get the host tools first when
        missing (root only; what CI does). Raises :class:`Arm64Unavailable` naming what is missing."""
        log = log or (lambda msg: None)
        if install:
            self._install_tools(log)
        if find_qemu() is None:
            raise Arm64Unavailable(self.missing())
        if self.ready:
            return self
        if shutil.which("debootstrap") is None:
            raise Arm64Unavailable("debootstrap is not installed (apt-get install debootstrap); it unpacks the arm64 "
                                   f"Debian root into {self.dir}")
        if os.geteuid() != 0:
            raise Arm64Unavailable("building the arm64 root needs root (debootstrap); run `python scripts/arm64.py "
                                   f"setup` as root once, or point CIRCLE_FX_ARM64_CACHE at a built one")
        os.makedirs(os.path.dirname(self.dir), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=self.key + ".", dir=os.path.dirname(self.dir))
        t0 = time.time()
        try:
            root, site = os.path.join(tmp, "root"), os.path.join(tmp, "site")
            log(f"debootstrap {SUITE} arm64 (first stage) -> {root}")
            _check_run(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase",
                        f"--include=python{PY}-minimal,libpython{PY}-stdlib,python{PY}", SUITE, root, _mirror()],
                       "debootstrap (the arm64 Debian root)")
            archives = os.path.join(root, "var", "cache", "apt", "archives")
            debs = sorted(f for f in os.listdir(archives) if f.endswith(".deb"))
            log(f"unpacking {len(debs)} packages")
            for deb in debs:
                _check_run(["dpkg-deb", "-x", os.path.join(archives, deb), root], f"dpkg-deb -x {deb}")
                os.unlink(os.path.join(archives, deb))
            wheels = os.path.join(tmp, "wheels")
            pins = [f"{k}=={v}" for k, v in sorted(self.versions.items())]
            log(f"pip download {' '.join(pins)} for aarch64")
            cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", wheels, "--only-binary=:all:",
                   "--python-version", PY, "--no-deps"]
            for p in PLATFORMS:
                cmd += ["--platform", p]
            _check_run(cmd + pins, f"pip download of the aarch64 wheels {pins}")
            import zipfile

            for whl in sorted(os.listdir(wheels)):
                with zipfile.ZipFile(os.path.join(wheels, whl)) as z:
                    z.extractall(site)
            shutil.rmtree(wheels)
            info = _smoke(root, site)
            info.update(versions=self.versions, seconds=round(time.time() - t0, 1), suite=SUITE)
            with open(os.path.join(tmp, "ready.json"), "w") as f:
                json.dump(info, f, indent=1)
            if os.path.exists(self.dir):  # a half-built directory of an earlier interrupted run
                shutil.rmtree(self.dir)
            os.rename(tmp, self.dir)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        log(f"arm64 side ready in {time.time() - t0:.0f} s: {self.dir}")
        return self

    @staticmethod
    def _install_tools(log) -> None:
        need = [p for p, ok in (("qemu-user-static", find_qemu()), ("debootstrap", shutil.which("debootstrap"))) if not ok]
        if not need:
            return
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise Arm64Unavailable(f"{', '.join(need)} missing and cannot be installed here (needs root and apt-get)")
        log(f"apt-get install {' '.join(need)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _check_run(["apt-get", "update", "-qq"], "apt-get update", env=env)
        _check_run(["apt-get", "install", "-y", "-qq", *need], f"apt-get install {' '.join(need)}", env=env)


#: seconds any one setup command may take (a stalled mirror must not hang CI): debootstrap took 18 s,
#: apt-get install ~20 s, the wheel download 2 s on the dev VM
SETUP_STEP_TIMEOUT = 600


def _check_run(cmd, what, env=None) -> None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SETUP_STEP_TIMEOUT)
    except FileNotFoundError as e:
        raise Arm64Unavailable(f"{what}: {e}") from None
    except subprocess.TimeoutExpired:
        raise Arm64Unavailable(f"{what} took more than {SETUP_STEP_TIMEOUT} s; stopped") from None
    if p.returncode:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-12:])
        raise Arm64Unavailable(f"{what} failed (exit {p.returncode}):\n{tail}")


def _smoke(root: str, site: str) -> dict:
    code = "import json, platform, onert, numpy; print(json.dumps({'machine': platform.machine(), 'numpy': numpy.__version__}))"
    p = subprocess.run([find_qemu(), "-L", root, os.path.join(root, "usr", "bin", f"python{PY}"), "-c", code],
                       capture_output=True, text=True, env={"PYTHONPATH": site, "PATH": "/usr/bin:/bin"}, timeout=300)
    if p.returncode:
        raise Arm64Unavailable(f"the arm64 Python could not import onert and numpy:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


class Arm64Runtime:
    """One persistent arm64 onert worker; sessions are handles into it. Use as a context
    manager (or call :meth:`close`); the worker also ends when the host process does."""

    def __init__(self, env: Arm64Env | None = None, setup: bool = False):
        self.env = env or Arm64Env()
        if setup:
            self.env.ensure()
        why = self.env.missing()
        if why:
            raise Arm64Unavailable(why)
        self._proc = None
        self._log = None
        #: counts worker starts: a session opened in an earlier worker (closed, or died) reopens
        self.generation = 0

    # ---------------------------------------------------------------- worker
    def _start(self) -> None:
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arm64_worker.py")
        self._log = tempfile.TemporaryFile(mode="w+b", prefix="circle_fx_arm64_")
        env = {"PYTHONPATH": self.env.site, "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        for k in ("NUM_THREADS", "USE_MMAPED_DATA", "TMPDIR"):
            if k in os.environ:
                env[k] = os.environ[k]
        self.generation += 1
        self._proc = subprocess.Popen([find_qemu(), "-L", self.env.root, self.env.python, "-P", "-s", worker],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env)

    def _printed(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def call(self, op: str, *args):
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            pickle.dump((op, *args), self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
            status, value = pickle.load(self._proc.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError) as e:
            code = self._proc.wait()
            printed = self._printed()
            self._proc = None
            raise RuntimeFailure(f"the arm64 onert worker died during {op!r} (exit {code}: {e!r}); its sessions are "
                                 f"gone\n  it printed:\n{printed}") from None
        if status != "ok":
            raise RuntimeFailure(f"arm64 onert, {op}: {value}")
        return value

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                pickle.dump(("quit",), self._proc.stdin)
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except Exception:
                self._proc.kill()
        self._proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def info(self) -> dict:
        """What the worker runs: ``machine`` (aarch64), onert's path, numpy's version."""
        return self.call("ping")

    # -------------------------------------------------------------- sessions
    def session(self, path: str, verified: bool = False) -> "Arm64Session":
        """As :class:`~circle_fx.circle.runtime.OnertSession`: ``run(inputs) -> outputs``."""
        if not verified:
            check_loadable(path)
        return Arm64Session(self, os.path.abspath(path), low_level=False)

    def bound_session(self, path: str) -> "Arm64BoundSession":
        """As the LLM runner's session: ``bind(index, array)``, ``run()``, ``output(index)``;
        the bound arrays' current contents are sent at each ``run`` (they live on the host)."""
        check_loadable(path)
        return Arm64BoundSession(self, os.path.abspath(path))


class Arm64Session:
    def __init__(self, rt: Arm64Runtime, path: str, low_level: bool):
        self.rt, self.path, self.low_level = rt, path, low_level
        self._open()

    def _open(self) -> None:
        try:
            self.handle = self.rt.call("open", self.path, self.low_level)
        except RuntimeFailure as e:
            raise RuntimeFailure(f"arm64 onert could not load {self.path}: {e}") from None
        self.generation = self.rt.generation

    def _current(self) -> int:
        """The handle in the running worker (a new worker, after a close or a crash, reopens the file)."""
        if self.generation != self.rt.generation or self.rt._proc is None or self.rt._proc.poll() is not None:
            if self.rt._proc is None or self.rt._proc.poll() is not None:
                self.rt._start()
            self._open()
        return self.handle

    def run(self, inputs: list) -> list:
        import numpy as np

        try:
            return self.rt.call("infer", self._current(), [np.ascontiguousarray(x) for x in inputs])
        except RuntimeFailure as e:
            raise RuntimeFailure(f"arm64 onert failed to run {self.path}: {e}") from None


class Arm64BoundSession(Arm64Session):
    def __init__(self, rt: Arm64Runtime, path: str):
        super().__init__(rt, path, low_level=True)
        self._bound: dict = {}
        self._outputs: list = []

    def bind(self, index: int, array) -> None:
        self._bound[index] = array

    def run(self) -> None:
        try:
            self._outputs = self.rt.call("run", self._current(), self._bound)
        except RuntimeFailure as e:
            raise RuntimeFailure(f"arm64 onert failed to run {self.path}: {e}") from None

    def output(self, index: int):
        return self._outputs[index]


def main(argv: list[str] | None = None) -> int:
    """``setup [--install]`` builds the cached arm64 side; ``check`` says whether it is usable."""
    import argparse

    ap = argparse.ArgumentParser(prog="arm64", description=main.__doc__)
    ap.add_argument("command", choices=["setup", "check"])
    ap.add_argument("--install", action="store_true", help="apt-get install qemu-user-static and debootstrap if missing")
    args = ap.parse_args(argv)
    env = Arm64Env()
    try:
        if args.command == "setup":
            env.ensure(install=args.install, log=lambda m: print("arm64:", m, flush=True))
        why = env.missing()
        if why:
            print("arm64 unavailable:", why)
            return 1
        with Arm64Runtime(env) as rt:
            print("arm64 ready:", env.dir, rt.info())
        return 0
    except Arm64Unavailable as e:
        print("arm64 unavailable:", e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
