"""Python client of Drover's gRPC API.

``Client`` wraps the stubs generated from the proto files (see
``drover_client._stubs``) with request ids on lifecycle calls, retries of
UNAVAILABLE across endpoints, and ``wait_for_operation``; ``stubs(module)``
gives a generated module itself, e.g. ``stubs("drover.v1.cluster_pb2")``.
"""

from ._stubs import StubError, load as stubs
from .client import Client, OperationTimeout

__all__ = ["Client", "OperationTimeout", "StubError", "stubs"]
