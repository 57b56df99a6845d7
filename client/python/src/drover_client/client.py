"""A small wrapper over the generated stubs.

Guarantees:
- Every lifecycle call carries a request id (a fresh UUID unless given), so
  sending it again after an UNAVAILABLE answer cannot start a second
  operation: the replica answers a repeated request id with the first
  result.
- UNAVAILABLE is retried with exponential backoff, moving to the next
  endpoint each time, a bounded number of times; every other error is
  raised as the server gave it (``grpc.RpcError``).

Caveats:
- Reads are retried too (they change nothing); ``update_cluster`` is not,
  since it has no request id.
"""

import time
import uuid
from typing import Iterable, Iterator, Optional, Sequence, Union

import grpc

from ._generated.drover.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    operation_pb2,
    operation_pb2_grpc,
    state_pb2,
    task_pb2,
    task_pb2_grpc,
)

_TERMINAL = ("OPERATION_STATE_SUCCEEDED", "OPERATION_STATE_FAILED", "OPERATION_STATE_CANCELLED")


class OperationTimeout(TimeoutError):
    """The operation did not finish within the wait."""

    def __init__(self, operation):
        super().__init__(f"operation {operation.id} of {operation.cluster} still running")
        self.operation = operation


def _split(endpoints: Union[str, Sequence[str]]) -> list:
    if isinstance(endpoints, str):
        endpoints = endpoints.split(",")
    found = [e.strip() for e in endpoints if e.strip()]
    if not found:
        raise ValueError("endpoints: at least one is required")
    return found


class Client:
    """Drover's API over one or more replicas (``"http://a:7070,http://b:7070"``
    or a list). ``token``: bearer token; ``ca_cert``: PEM bytes or a path of
    the CA that signed the replicas' certificates (TLS); ``https://``
    endpoints use TLS with the system's roots when no CA is given."""

    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        token: Optional[str] = None,
        ca_cert: Optional[Union[bytes, str]] = None,
        attempts: int = 6,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
        call_timeout: float = 30.0,
    ):
        if isinstance(ca_cert, str):
            with open(ca_cert, "rb") as file:
                ca_cert = file.read()
        self._token = token
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._call_timeout = call_timeout
        # The generated modules, for building requests and reading enums.
        self.cluster_pb2 = cluster_pb2
        self.operation_pb2 = operation_pb2
        self.task_pb2 = task_pb2
        self.state_pb2 = state_pb2
        self._channels = [self._channel(e, ca_cert) for e in _split(endpoints)]
        self._stubs = [
            (
                cluster_pb2_grpc.ClustersStub(c),
                operation_pb2_grpc.OperationsStub(c),
                task_pb2_grpc.TasksStub(c),
            )
            for c in self._channels
        ]
        self._current = 0

    @staticmethod
    def _channel(endpoint: str, ca_cert: Optional[bytes]) -> grpc.Channel:
        if endpoint.startswith("https://") or ca_cert is not None:
            target = endpoint.removeprefix("https://").removeprefix("http://")
            return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca_cert))
        return grpc.insecure_channel(endpoint.removeprefix("http://"))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def _call(self, service: int, method: str, request, timeout: Optional[float] = None):
        """Calls ``method`` on the current endpoint; UNAVAILABLE moves to the
        next one after a backoff, at most ``attempts`` times in all."""
        metadata = [("authorization", f"Bearer {self._token}")] if self._token else None
        delay = self._backoff
        for attempt in range(self._attempts):
            stub = self._stubs[self._current][service]
            try:
                return getattr(stub, method)(
                    request, timeout=timeout or self._call_timeout, metadata=metadata
                )
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == self._attempts:
                    raise
            self._current = (self._current + 1) % len(self._stubs)
            time.sleep(delay)
            delay = min(delay * 2, self._max_backoff)
        raise AssertionError("unreachable: the last attempt raises")

    # Clusters: reads.

    def get_cluster(self, name: str, linearizable: bool = False):
        request = self.cluster_pb2.GetClusterRequest(name=name, linearizable=linearizable)
        return self._call(0, "GetCluster", request)

    def list_clusters(self, label_selector: str = "", linearizable: bool = False, page_size: int = 0) -> list:
        """Every cluster, all pages, in one list (``iter_clusters`` holds one
        page at a time instead)."""
        return list(self.iter_clusters(label_selector, linearizable, page_size))

    def iter_clusters(self, label_selector: str = "", linearizable: bool = False, page_size: int = 0) -> Iterator:
        """Every cluster, in name order, yielded page by page as each page
        arrives: the next page is asked for only once this one is consumed,
        so a fleet of any size takes one page of memory. ``page_size``:
        clusters per page, 1..=1000 (0: the server's default, 100)."""
        token = ""
        while True:
            page = self._call(
                0,
                "ListClusters",
                self.cluster_pb2.ListClustersRequest(
                    page_size=page_size, page_token=token, label_selector=label_selector, linearizable=linearizable
                ),
            )
            yield from page.clusters
            if not page.next_page_token:
                return
            # The one way a listing could go on forever; the page count
            # cannot bound it, as a fleet may take any number of pages.
            if page.next_page_token == token:
                raise RuntimeError(f"iter_clusters: the server handed back the page token {token!r} it was given")
            token = page.next_page_token

    # Clusters: lifecycle, each with a request id.

    def create_cluster(
        self,
        name: str,
        version: str,
        control_nodes: int = 1,
        worker_nodes: int = 0,
        node_offering: str = "small",
        labels: Optional[dict] = None,
        create_only: bool = False,
        request_id: Optional[str] = None,
    ):
        """Returns the CreateClusterResponse: the cluster and, unless
        ``create_only``, the operation that starts it."""
        spec = self.cluster_pb2.ClusterSpec(
            version=version,
            control_nodes=control_nodes,
            worker_nodes=worker_nodes,
            node_offering=node_offering,
            labels=labels or {},
        )
        request = self.cluster_pb2.CreateClusterRequest(
            name=name, spec=spec, create_only=create_only, request_id=request_id or str(uuid.uuid4())
        )
        return self._call(0, "CreateCluster", request)

    def _lifecycle(self, method: str, request_type: str, request_id: Optional[str], wait: Optional[float], **fields):
        """Asks for an operation. With ``wait`` (seconds, at most an hour),
        the call answers once the operation has ended, or still running when
        ``wait`` ran out (``wait_for_operation`` follows it): one call
        instead of two."""
        request = getattr(self.cluster_pb2, request_type)(request_id=request_id or str(uuid.uuid4()), **fields)
        if not wait:
            return self._call(0, method, request)
        request.wait_ms = max(1, int(wait * 1000))
        return self._call(0, method, request, timeout=wait + 10)

    def start(self, name: str, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("StartCluster", "StartClusterRequest", request_id, wait, name=name)

    def stop(self, name: str, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("StopCluster", "StopClusterRequest", request_id, wait, name=name)

    def delete(self, name: str, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("DeleteCluster", "DeleteClusterRequest", request_id, wait, name=name)

    def upgrade(self, name: str, version: str, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("UpgradeCluster", "UpgradeClusterRequest", request_id, wait, name=name, version=version)

    def scale(
        self,
        name: str,
        worker_nodes: Optional[int] = None,
        node_offering: Optional[str] = None,
        request_id: Optional[str] = None,
        wait: Optional[float] = None,
    ):
        fields = {"name": name}
        if worker_nodes is not None:
            fields["worker_nodes"] = worker_nodes
        if node_offering is not None:
            fields["node_offering"] = node_offering
        return self._lifecycle("ScaleCluster", "ScaleClusterRequest", request_id, wait, **fields)

    def add_nodes(self, name: str, count: int, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("AddNodes", "AddNodesRequest", request_id, wait, name=name, count=count)

    def remove_nodes(self, name: str, node_ids: Iterable[str], request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("RemoveNodes", "RemoveNodesRequest", request_id, wait, name=name, node_ids=list(node_ids))

    def recover(self, name: str, request_id: Optional[str] = None, wait: Optional[float] = None):
        return self._lifecycle("RecoverCluster", "RecoverClusterRequest", request_id, wait, name=name)

    # Operations.

    def get_operation(self, cluster: str, operation_id: str):
        request = self.operation_pb2.GetOperationRequest(cluster=cluster, id=operation_id)
        return self._call(1, "GetOperation", request)

    def list_operations(self, cluster: str) -> list:
        request = self.operation_pb2.ListOperationsRequest(cluster=cluster)
        return list(self._call(1, "ListOperations", request).operations)

    def wait_for_operation(self, operation, timeout: float = 60.0):
        """Waits until ``operation`` (an Operation) has finished, for at most
        ``timeout`` seconds; returns it finished (succeeded, failed or
        cancelled) or raises OperationTimeout."""
        deadline = time.monotonic() + timeout
        state = self.operation_pb2.OperationState
        terminal = {state.Value(name) for name in _TERMINAL}
        while operation.state not in terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationTimeout(operation)
            wait_ms = max(1, min(int(left * 1000), 60_000))
            request = self.operation_pb2.WaitOperationRequest(
                cluster=operation.cluster, id=operation.id, timeout_ms=wait_ms
            )
            operation = self._call(1, "WaitOperation", request, timeout=wait_ms / 1000 + 10)
        return operation

    def succeeded(self, operation) -> bool:
        return operation.state == self.operation_pb2.OperationState.Value("OPERATION_STATE_SUCCEEDED")

    # Tasks.

    def put_task(self, cluster: str, task):
        return self._call(2, "PutTask", self.task_pb2.PutTaskRequest(cluster=cluster, task=task))

    def list_tasks(self, cluster: str) -> list:
        return list(self._call(2, "ListTasks", self.task_pb2.ListTasksRequest(cluster=cluster)).tasks)
