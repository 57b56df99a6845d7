"""Drives Drover's gRPC API from Python, with stubs generated from the
proto files by grpcio-tools, to prove the contract works from another
language.

    python3 drover_smoke.py PROTO_DIR ENDPOINT

Generates the stubs into a temporary directory, then creates a cluster
(create_only), reads it back, lists it, puts a backup task and reads it
back, and checks that bad input is refused with INVALID_ARGUMENT naming the
field. Exits non-zero on any mismatch.
"""

import importlib
import pathlib
import sys
import tempfile

import grpc
from grpc_tools import protoc


def generate(proto_dir: pathlib.Path, out_dir: pathlib.Path) -> None:
    protos = sorted(str(p.relative_to(proto_dir)) for p in (proto_dir / "drover" / "v1").glob("*.proto"))
    # grpc_tools ships the well-known types (google/protobuf/timestamp.proto).
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *protos,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with {code}")
    # Make the generated folders importable packages.
    for folder in (out_dir / "drover", out_dir / "drover" / "v1"):
        (folder / "__init__.py").touch()


def main() -> None:
    proto_dir, endpoint = pathlib.Path(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory() as out:
        generate(proto_dir, pathlib.Path(out))
        sys.path.insert(0, out)
        cluster_pb2 = importlib.import_module("drover.v1.cluster_pb2")
        cluster_grpc = importlib.import_module("drover.v1.cluster_pb2_grpc")
        state_pb2 = importlib.import_module("drover.v1.state_pb2")

        channel = grpc.insecure_channel(endpoint.removeprefix("http://"))
        clusters = cluster_grpc.ClustersStub(channel)
        spec = cluster_pb2.ClusterSpec(version="1.29.4", control_nodes=1, worker_nodes=2, node_offering="small")
        created = clusters.CreateCluster(cluster_pb2.CreateClusterRequest(name="py-made", spec=spec, create_only=True))
        assert created.cluster.name == "py-made", created
        assert created.cluster.status.state == state_pb2.CLUSTER_STATE_CREATED, created

        got = clusters.GetCluster(cluster_pb2.GetClusterRequest(name="py-made", linearizable=True))
        assert got.uid == created.cluster.uid, got

        listed = clusters.ListClusters(cluster_pb2.ListClustersRequest(linearizable=True))
        assert [c.name for c in listed.clusters] == ["py-made"], listed

        task_pb2 = importlib.import_module("drover.v1.task_pb2")
        task_grpc = importlib.import_module("drover.v1.task_pb2_grpc")
        tasks = task_grpc.TasksStub(channel)
        backup = task_pb2.TaskSpec(
            type=task_pb2.TASK_TYPE_BACKUP,
            name="nightly",
            schedule=task_pb2.TaskSchedule(cron="0 2 * * *", timezone="Europe/Warsaw"),
            backup=task_pb2.BackupProperties(location=["dc1:s3:py-backups"]),
        )
        put = tasks.PutTask(task_pb2.PutTaskRequest(cluster="py-made", task=backup))
        assert put.spec.name == "nightly", put
        listed_tasks = tasks.ListTasks(task_pb2.ListTasksRequest(cluster="py-made"))
        assert [t.spec.name for t in listed_tasks.tasks] == ["nightly"], listed_tasks
        no_location = task_pb2.TaskSpec(type=task_pb2.TASK_TYPE_BACKUP, name="broken")
        try:
            tasks.PutTask(task_pb2.PutTaskRequest(cluster="py-made", task=no_location))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert error.details().startswith("task.backup.location: "), error.details()
        else:
            raise AssertionError("a backup without a location was accepted")

        try:
            clusters.CreateCluster(cluster_pb2.CreateClusterRequest(name="Bad_Name", spec=spec))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert error.details().startswith("name: "), error.details()
        else:
            raise AssertionError("a bad name was accepted")
        print("python client: ok")


if __name__ == "__main__":
    main()
