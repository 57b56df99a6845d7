"""Python stubs generated from Drover's proto files with grpcio-tools.

They are generated on first import into a cache directory named after a
digest of the proto files, so a changed contract gets fresh stubs and an
unchanged one is generated once; nothing generated is committed.

The proto directory is ``DROVER_PROTO_DIR`` when set, otherwise the
repository's ``proto/`` next to this package's source (what
``pip install -e client/python`` and running from the tree see).
"""

import hashlib
import importlib
import os
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc


class StubError(RuntimeError):
    """The proto files cannot be found or compiled."""


def proto_dir() -> pathlib.Path:
    given = os.environ.get("DROVER_PROTO_DIR")
    if given:
        return pathlib.Path(given)
    return pathlib.Path(__file__).resolve().parents[3] / "proto"


def _cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "drover_client"


def _generate(protos: pathlib.Path, files: list, out: pathlib.Path) -> None:
    # grpc_tools ships the well-known types (google/protobuf/timestamp.proto).
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{protos}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *files,
        ]
    )
    if code != 0:
        raise StubError(f"protoc failed with {code} on {protos}")
    for folder in {out / pathlib.Path(f).parent for f in files} | {out / "drover", out / "drover" / "provider"}:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()


def stub_dir() -> pathlib.Path:
    """The directory holding the generated ``drover`` package, made if needed."""
    protos = proto_dir()
    files = sorted(str(p.relative_to(protos)) for p in protos.glob("drover/**/*.proto"))
    if not files:
        raise StubError(f"no .proto files under {protos}; set DROVER_PROTO_DIR")
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode())
        digest.update((protos / name).read_bytes())
    target = _cache_root() / digest.hexdigest()[:16]
    if not (target / "drover").is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Generated apart, then renamed into place: a concurrent import sees
        # either nothing or every file.
        scratch = pathlib.Path(tempfile.mkdtemp(dir=target.parent))
        try:
            _generate(protos, files, scratch)
            try:
                scratch.rename(target)
            except OSError:
                if not (target / "drover").is_dir():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def load(module: str):
    """Imports a generated module, e.g. ``drover.v1.cluster_pb2``."""
    path = str(stub_dir())
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(module)
