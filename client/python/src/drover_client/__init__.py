"""Python client of Drover's gRPC API.

``Client`` wraps the stubs generated from the proto files when the package
was built (``drover_client._generated``) with request ids on lifecycle
calls, retries of UNAVAILABLE across endpoints, and ``wait_for_operation``;
``stubs(module)`` gives a generated module itself, e.g.
``stubs("drover.v1.cluster_pb2")``.
"""

import importlib
from types import ModuleType

from .client import Client, OperationTimeout

__all__ = ["Client", "OperationTimeout", "stubs"]


def stubs(module: str) -> ModuleType:
    """A generated module by its proto package path, e.g.
    ``drover.v1.cluster_pb2`` or ``drover.provider.v1.simulator_pb2_grpc``."""
    return importlib.import_module(f"{__name__}._generated.{module}")
