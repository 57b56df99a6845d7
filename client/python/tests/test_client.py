"""drover_client against a live replica."""

import socket

import grpc
import pytest

from drover_client import Client, OperationTimeout, stubs


def _succeeded(client, operation, timeout=60):
    done = client.wait_for_operation(operation, timeout=timeout)
    assert client.succeeded(done), done
    return done


def test_a_cluster_through_its_whole_lifecycle(client):
    created = client.create_cluster("py-life", version="1.29.0", worker_nodes=1, node_offering="small")
    assert created.cluster.name == "py-life"
    _succeeded(client, created.operation)
    state = client.state_pb2.ClusterState
    assert client.get_cluster("py-life", linearizable=True).status.state == state.Value("CLUSTER_STATE_RUNNING")
    assert "py-life" in [c.name for c in client.list_clusters(linearizable=True)]

    _succeeded(client, client.stop("py-life"))
    assert client.get_cluster("py-life").status.state == state.Value("CLUSTER_STATE_STOPPED")
    _succeeded(client, client.start("py-life"))
    _succeeded(client, client.upgrade("py-life", "1.30.0"))
    assert client.get_cluster("py-life", linearizable=True).status.current_version == "1.30.0"
    _succeeded(client, client.scale("py-life", worker_nodes=2))
    kinds = [op.kind for op in client.list_operations("py-life")]
    assert len(kinds) == 5, kinds
    _succeeded(client, client.delete("py-life"))


def test_a_lifecycle_call_can_wait_for_its_operation(client):
    created = client.create_cluster("py-wait", version="1.29.0", worker_nodes=1, node_offering="small")
    _succeeded(client, created.operation)
    stopped = client.stop("py-wait", wait=30)
    assert client.succeeded(stopped), stopped
    state = client.state_pb2.ClusterState
    assert client.get_cluster("py-wait").status.state == state.Value("CLUSTER_STATE_STOPPED")
    _succeeded(client, client.delete("py-wait"))


def test_iter_clusters_asks_for_each_page_as_it_is_reached(client, monkeypatch):
    """A generator: nothing is read before the first cluster is wanted, and
    the next page only once the one before is used up."""
    names = [f"py-page-{i}" for i in range(5)]
    for name in names:
        client.create_cluster(name, version="1.29.0", labels={"py-paging": "yes"}, create_only=True)
    pages_read = []
    call = client._call

    def counted(service, method, request, timeout=None):
        pages_read.append(request.page_token)
        return call(service, method, request, timeout)

    monkeypatch.setattr(client, "_call", counted)
    clusters = client.iter_clusters(label_selector="py-paging=yes", linearizable=True, page_size=2)
    assert len(pages_read) == 0
    assert [next(clusters).name for _ in range(2)] == names[:2]
    assert len(pages_read) == 1
    assert next(clusters).name == names[2]
    assert len(pages_read) == 2
    assert [c.name for c in clusters] == names[3:]
    assert len(pages_read) == 3 and pages_read[0] == ""
    # list_clusters is the same listing, whole.
    listed = client.list_clusters(label_selector="py-paging=yes", linearizable=True, page_size=2)
    assert [c.name for c in listed] == names


def test_a_repeated_request_id_starts_nothing_new(client):
    created = client.create_cluster("py-once", version="1.29.0")
    _succeeded(client, created.operation)
    first = client.stop("py-once", request_id="py-once-stop")
    again = client.stop("py-once", request_id="py-once-stop")
    assert again.id == first.id
    _succeeded(client, first)


def test_a_lifecycle_call_carries_a_fresh_request_id(client):
    """Without one given, two calls are two requests: the second stop of a
    stopping cluster is refused or queued, never the first one again."""
    created = client.create_cluster("py-fresh", version="1.29.0", create_only=True)
    first = client.start("py-fresh")
    try:
        second = client.start("py-fresh")
    except grpc.RpcError as error:
        assert error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED), error
    else:
        assert second.id != first.id
    assert created.cluster.uid == first.cluster_uid


def test_unavailable_moves_to_the_next_endpoint(endpoint):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}"
    # The dead one first: its UNAVAILABLE is retried on the live one.
    with Client([dead, endpoint], backoff=0.01) as client:
        created = client.create_cluster("py-failover", version="1.29.0", create_only=True)
        assert client.get_cluster("py-failover").uid == created.cluster.uid


def test_every_endpoint_down_raises_unavailable_after_bounded_attempts():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}"
    with Client(dead, attempts=3, backoff=0.01, call_timeout=5) as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.list_clusters()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_waiting_less_than_an_operation_takes_times_out(client):
    # The replica's simulator sleeps --step-latency-ms on every step, so
    # no operation can finish within a millisecond.
    created = client.create_cluster("py-slow", version="1.29.0")
    with pytest.raises(OperationTimeout) as raised:
        client.wait_for_operation(created.operation, timeout=0.001)
    assert raised.value.operation.id == created.operation.id
    _succeeded(client, created.operation)


def test_bad_input_is_refused_naming_the_field(client):
    with pytest.raises(grpc.RpcError) as raised:
        client.create_cluster("Bad_Name", version="1.29.0")
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("name: "), raised.value.details()


def test_the_generated_stubs_are_there_for_everything_else(client):
    task_pb2 = stubs("drover.v1.task_pb2")
    client.create_cluster("py-tasks", version="1.29.0", create_only=True)
    backup = task_pb2.TaskSpec(
        type=task_pb2.TASK_TYPE_BACKUP,
        name="nightly",
        schedule=task_pb2.TaskSchedule(cron="0 2 * * *", timezone="Europe/Warsaw"),
        backup=task_pb2.BackupProperties(location=["dc1:s3:py-backups"]),
    )
    assert client.put_task("py-tasks", backup).spec.name == "nightly"
    assert [t.spec.name for t in client.list_tasks("py-tasks")] == ["nightly"]
    # The simulator's control service, too.
    assert stubs("drover.provider.v1.simulator_pb2_grpc").SimulatorStub
