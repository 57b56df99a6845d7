"""Builds drover_client with the Python stubs of Drover's proto files.

At build time grpcio-tools (a build requirement, not a runtime one)
generates ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` from the protos
into the package's ``drover_client/_generated``, with the imports between
them made package-relative. The protos are the sdist's ``proto/`` (which
the sdist command copies in) or, from the source tree, the repository's
``proto/``.

The runtime requirements follow the generator: generated code refuses a
grpcio or protobuf older than the one it was generated for.

Editable installs are refused: the source tree has no stubs to import.
Nothing is written into the source tree: the build directory, the
egg-info and the generated stubs live in a temporary directory removed
when the build ends.
"""

import atexit
import pathlib
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
GENERATED = pathlib.PurePosixPath("drover_client", "_generated")
# Without these markers the generated code says nothing, so these floors
# (what the client needs anyway) stand.
MIN_GRPCIO = "1.50"
MIN_PROTOBUF = "4.21"

SCRATCH = pathlib.Path(tempfile.mkdtemp(prefix="drover-client-build-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)


def proto_root() -> pathlib.Path:
    """The sdist's proto/, else the repository's."""
    for root in (HERE / "proto", HERE.parent.parent / "proto"):
        if any(root.glob("drover/**/*.proto")):
            return root
    raise SystemExit(
        f"no drover/**/*.proto under {HERE / 'proto'} (an sdist) nor {HERE.parent.parent / 'proto'} "
        "(the repository): build from the repository's client/python or from an sdist"
    )


def proto_files(root: pathlib.Path) -> list:
    return sorted(p.relative_to(root).as_posix() for p in root.glob("drover/**/*.proto"))


_IMPORT = re.compile(r"^from (drover(?:\.\w+)*) import ", re.MULTILINE)


def _relative(importer: tuple, target: tuple) -> str:
    """``from drover.provider.v1 import`` as seen from the package
    ``importer`` (e.g. ``("drover", "v1")``): ``from ..provider.v1 import``."""
    common = 0
    while common < min(len(importer), len(target)) and importer[common] == target[common]:
        common += 1
    return "." * (len(importer) - common + 1) + ".".join(target[common:])


def generate(out: pathlib.Path) -> None:
    """Generates the stubs of every proto under proto_root() into ``out``
    (the ``_generated`` package's directory)."""
    from grpc_tools import protoc

    root = proto_root()
    # grpc_tools ships the well-known types (google/protobuf/timestamp.proto).
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    out.mkdir(parents=True)
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *proto_files(root),
        ]
    )
    if code != 0:
        raise SystemExit(f"grpc_tools.protoc failed with {code} on {root}")
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    for path in out.rglob("*.py*"):
        importer = path.parent.relative_to(out).parts
        text = _IMPORT.sub(
            lambda m: f"from {_relative(importer, tuple(m.group(1).split('.')))} import ",
            path.read_text(encoding="utf-8"),
        )
        if re.search(r"^\s*(import|from) drover\b", text, re.MULTILINE):
            raise SystemExit(f"{path.relative_to(out)}: an import of drover left absolute")
        path.write_text(text, encoding="utf-8")


def runtime_requirements(out: pathlib.Path) -> list:
    """grpcio and protobuf at least as new as the generated code asks for."""
    grpcio, protobuf = MIN_GRPCIO, MIN_PROTOBUF
    for path in out.rglob("*_pb2_grpc.py"):
        found = re.search(
            r"^GRPC_GENERATED_VERSION = '([0-9.]+)'", path.read_text(encoding="utf-8"), re.MULTILINE
        )
        if found:
            grpcio = found.group(1)
            break
    for path in out.rglob("*_pb2.py"):
        found = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
            path.read_text(encoding="utf-8"),
        )
        if found:
            protobuf = ".".join(found.groups())
            break
    return [f"grpcio>={grpcio}", f"protobuf>={protobuf}"]


STUBS = SCRATCH / "stubs"
generate(STUBS)


class BuildPy(build_py):
    """Copies the generated stubs into the built package."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib, GENERATED)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(STUBS, target)

    def get_outputs(self, include_bytecode=True):
        target = pathlib.Path(self.build_lib, GENERATED)
        generated = [str(target / p.relative_to(STUBS)) for p in STUBS.rglob("*") if p.is_file()]
        return super().get_outputs(include_bytecode) + generated


class Sdist(sdist):
    """Puts the protos into the sdist (as proto/), so that a wheel can be
    built from it."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for name in proto_files(root):
            target = pathlib.Path(base_dir, "proto", name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, target)


class NoEditable(editable_wheel):
    """An editable install would import the source tree, which has no
    stubs: refused, naming what works."""

    def run(self):
        raise SystemExit(
            "drover-client cannot be installed editable (its stubs exist only in a built package): "
            "pip install client/python, without -e"
        )


setup(
    install_requires=runtime_requirements(STUBS),
    cmdclass={"build_py": BuildPy, "sdist": Sdist, "editable_wheel": NoEditable},
    options={
        "build": {"build_base": str(SCRATCH / "build")},
        "egg_info": {"egg_base": str(SCRATCH)},
    },
)
