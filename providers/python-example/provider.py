"""A drover.provider.v1 provider in Python: nodes held in memory, the
contract kept (fencing, draining, deadlines, idempotency, error codes).
The second example, after Drover's own simulator, of a provider written
against the proto files alone; drover-provider-check passes against it.

    python3 provider.py PROTO_DIR [--listen 127.0.0.1:7090] [--work-ms 0]

Generates the stubs from PROTO_DIR with grpcio-tools into a temporary
directory, serves until interrupted, and prints "serving on ADDRESS" once
it accepts calls.

Every call holds one lock for its whole length, from the fencing check to
its answer: a call under a newer epoch therefore starts only after every
older call has ended, which is the drain the contract asks for, and task
runs end at once (DONE), so none is left for a newer epoch to stop. A real
provider whose calls take time must abort or wait for older calls instead
(see PROVIDERS.md).

--work-ms makes every mutating step take that long, as a real cloud's do.
The work is carried across repeated calls, as the contract asks: the first
call of a step (cluster, method, operation, request: whatever the epoch)
starts it, a call whose deadline comes first answers DEADLINE_EXCEEDED
having applied nothing, and the same call sent again waits only for the
rest, then applies once.
"""

import argparse
import importlib
import pathlib
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
from grpc_tools import protoc

VERSIONS = ["1.0.0", "1.1.0"]
OFFERINGS = ["small", "large"]
MAX_CONTROL, MAX_WORKERS = 3, 10


def generate(proto_dir: pathlib.Path, out_dir: pathlib.Path) -> None:
    protos = ["drover/v1/task.proto", "drover/provider/v1/provider.proto"]
    # grpc_tools ships the well-known types (google/protobuf/timestamp.proto).
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        ["grpc_tools.protoc", f"-I{proto_dir}", f"-I{well_known}",
         f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with {code}")
    for folder in ("drover", "drover/v1", "drover/provider", "drover/provider/v1"):
        (out_dir / folder / "__init__.py").touch()


class Refused(Exception):
    """A call refused with a gRPC status code and a message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


# Work done and not asked for again within this long is forgotten.
FORGET_WORK_AFTER = 300.0


def time_left(context):
    """Seconds left of the call's deadline (gRPC or drover-apply-by), or None."""
    apply_by = dict(context.invocation_metadata()).get("drover-apply-by")
    left = [x for x in (context.time_remaining(),
                        None if apply_by is None else int(apply_by) / 1000 - time.time()) if x is not None]
    return min(left) if left else None


def make_servicer(pb, pb_grpc, work_seconds=0.0):
    class Provider(pb_grpc.ProviderServicer):
        def __init__(self):
            self.lock = threading.Lock()
            self.work = {}  # (uid, method, operation, request) -> when its work is done
            self.clusters = {}  # uid -> {node id -> ProviderNode}
            self.newest = {}  # uid -> newest epoch seen
            self.runs = {}  # run id -> RunTaskResponse
            self.next_worker = {}  # uid -> next worker index

        # --- the contract's common steps -------------------------------

        def fenced(self, token, context):
            """Checks the token, the deadline, and records the epoch."""
            if token is None or not token.cluster_uid:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "token.cluster_uid: is required")
            newest = self.newest.get(token.cluster_uid)
            if newest is not None and token.epoch < newest:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"stale fencing token: epoch {token.epoch} is older than {newest}")
            apply_by = dict(context.invocation_metadata()).get("drover-apply-by")
            left = context.time_remaining()
            if (apply_by is not None and int(apply_by) <= time.time() * 1000) or (left is not None and left <= 0):
                raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before it applied")
            self.newest[token.cluster_uid] = token.epoch
            return token.cluster_uid

        def carry_work(self, context, method, request):
            """Waits for the step's work, started by its first call; at the
            deadline, if that comes first, refuses with nothing applied."""
            if not work_seconds or not request.HasField("token"):
                return
            bare = type(request)()
            bare.CopyFrom(request)
            bare.ClearField("token")
            key = (request.token.cluster_uid, method, request.token.operation_id,
                   bare.SerializeToString(deterministic=True))
            with self.lock:
                now = time.monotonic()
                self.work = {k: done for k, done in self.work.items() if done + FORGET_WORK_AFTER > now}
                done = self.work.setdefault(key, now + work_seconds)
            left = time_left(context)
            if left is not None and now + left < done:
                time.sleep(max(left, 0))
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"{method}: the work goes on ({done - now - left:.3f} s left); nothing applied yet: send it again")
            time.sleep(max(done - time.monotonic(), 0))

        def call(self, context, request, act, method=None):
            """Runs act(uid) under the lock for a fenced request, after its
            work when it is a mutating step (method); maps refusals."""
            if method is not None:
                self.carry_work(context, method, request)
            with self.lock:
                try:
                    token = request.token if request.HasField("token") else None
                    return act(self.fenced(token, context))
                except Refused as refused:
                    context.abort(refused.code, refused.message)

        def existing(self, uid):
            nodes = self.clusters.get(uid)
            if not nodes:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"cluster {uid} has no nodes")
            return nodes

        def answer(self, uid):
            nodes = self.clusters.get(uid, {})
            return pb.NodesResponse(nodes=[nodes[k] for k in sorted(nodes)])

        def node(self, role, index, version, offering):
            return pb.ProviderNode(id=f"{role}-{index}", role=role, power_state="on", version=version,
                                   healthy=True, offering=offering, facts={"address": f"{role}-{index}.local"})

        # --- the calls ---------------------------------------------------

        def CreateNodes(self, request, context):
            def act(uid):
                if request.version not in VERSIONS:
                    raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"version: {request.version!r} is not one of {VERSIONS}")
                if request.offering not in OFFERINGS:
                    raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"offering: {request.offering!r} is not one of {OFFERINGS}")
                nodes = self.clusters.setdefault(uid, {})
                if not nodes:  # idempotent: a repeat finds the nodes made
                    for i in range(request.control_nodes):
                        n = self.node("control", i, request.version, request.offering)
                        nodes[n.id] = n
                    for i in range(request.worker_nodes):
                        n = self.node("worker", i, request.version, request.offering)
                        nodes[n.id] = n
                    self.next_worker[uid] = request.worker_nodes
                return self.answer(uid)
            return self.call(context, request, act, "CreateNodes")

        def power(self, request, context, state, method):
            def act(uid):
                for n in self.existing(uid).values():
                    n.power_state = state
                return self.answer(uid)
            return self.call(context, request, act, method)

        def StartNodes(self, request, context):
            return self.power(request, context, "on", "StartNodes")

        def StopNodes(self, request, context):
            return self.power(request, context, "off", "StopNodes")

        def DeleteNodes(self, request, context):
            def act(uid):
                nodes = self.clusters.get(uid, {})
                for node_id in list(request.node_ids) or list(nodes):
                    nodes.pop(node_id, None)  # a node already gone is no error
                return self.answer(uid)
            return self.call(context, request, act, "DeleteNodes")

        def ResizeNodes(self, request, context):
            def act(uid):
                nodes = self.existing(uid)
                if request.HasField("offering"):
                    for n in nodes.values():
                        n.offering = request.offering
                if request.HasField("worker_nodes"):
                    workers = sorted((n for n in nodes.values() if n.role == "worker"), key=lambda n: int(n.id.split("-")[1]))
                    template = next(iter(nodes.values()))
                    for _ in range(request.worker_nodes - len(workers)):
                        n = self.node("worker", self.next_worker[uid], template.version, template.offering)
                        n.power_state = template.power_state
                        nodes[n.id] = n
                        self.next_worker[uid] += 1
                    for n in workers[request.worker_nodes:]:
                        del nodes[n.id]
                return self.answer(uid)
            return self.call(context, request, act, "ResizeNodes")

        def UpgradeNode(self, request, context):
            def act(uid):
                node = self.existing(uid).get(request.node_id)
                if node is None:
                    raise Refused(grpc.StatusCode.NOT_FOUND, f"node {request.node_id} does not exist")
                node.version = request.version
                return self.answer(uid)
            return self.call(context, request, act, "UpgradeNode")

        def RepairNodes(self, request, context):
            def act(uid):
                for n in self.existing(uid).values():
                    n.power_state, n.healthy = "on", True
                return self.answer(uid)
            return self.call(context, request, act, "RepairNodes")

        def DescribeCluster(self, request, context):
            with self.lock:
                if request.HasField("token"):
                    try:
                        self.fenced(request.token, context)
                    except Refused as refused:
                        context.abort(refused.code, refused.message)
                return self.answer(request.cluster_uid)

        def RunTask(self, request, context):
            def act(uid):
                if not request.run_id:
                    raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "run_id: is required")
                # Idempotent per run id: a repeat reports the same run.
                return self.runs.setdefault(request.run_id, pb.RunTaskResponse(status="DONE", report=f"{request.task_type} of {uid}: nothing to do"))
            return self.call(context, request, act)

        def StopTask(self, request, context):
            def act(uid):
                if request.run_id not in self.runs:
                    raise Refused(grpc.StatusCode.NOT_FOUND, f"run {request.run_id} is unknown")
                return pb.StopTaskResponse()
            return self.call(context, request, act)

        def ValidateSpec(self, request, context):
            shape, violations = request.shape, []
            if not 1 <= shape.control_nodes <= MAX_CONTROL:
                violations.append(pb.SpecViolation(field="control_nodes", reason=f"must be 1 to {MAX_CONTROL}"))
            if shape.worker_nodes > MAX_WORKERS:
                violations.append(pb.SpecViolation(field="worker_nodes", reason=f"must be at most {MAX_WORKERS}"))
            if shape.version not in VERSIONS:
                violations.append(pb.SpecViolation(field="version", reason=f"must be one of {VERSIONS}"))
            if shape.offering not in OFFERINGS:
                violations.append(pb.SpecViolation(field="node_offering", reason=f"must be one of {OFFERINGS}"))
            return pb.ValidateSpecResponse(violations=violations)

        def GetCapabilities(self, request, context):
            return pb.Capabilities(kind="python-example", versions=VERSIONS, offerings=OFFERINGS,
                                   min_control_nodes=1, max_control_nodes=MAX_CONTROL, min_worker_nodes=0,
                                   max_worker_nodes=MAX_WORKERS, task_types=["repair"])

    return Provider()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proto_dir", type=pathlib.Path)
    parser.add_argument("--listen", default="127.0.0.1:7090")
    parser.add_argument("--work-ms", type=int, default=0,
                        help="how long every mutating step's work takes (carried across repeated calls)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        generate(args.proto_dir, pathlib.Path(out))
        sys.path.insert(0, out)
        pb = importlib.import_module("drover.provider.v1.provider_pb2")
        pb_grpc = importlib.import_module("drover.provider.v1.provider_pb2_grpc")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_ProviderServicer_to_server(make_servicer(pb, pb_grpc, args.work_ms / 1000), server)
        if server.add_insecure_port(args.listen) == 0:
            raise SystemExit(f"cannot listen on {args.listen}")
        server.start()
        print(f"serving on {args.listen}", flush=True)
        server.wait_for_termination()


if __name__ == "__main__":
    main()
