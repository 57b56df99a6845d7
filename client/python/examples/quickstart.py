"""Creates a cluster on a replica, waits for it to run, upgrades it and
deletes it, with drover_client.

    python3 examples/quickstart.py http://127.0.0.1:7070
"""

import sys

from drover_client import Client


def main() -> None:
    with Client(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7070") as client:
        created = client.create_cluster("py-quickstart", version="1.29.0", worker_nodes=2)
        running = client.wait_for_operation(created.operation, timeout=120)
        print("create:", client.operation_pb2.OperationState.Name(running.state))
        upgraded = client.wait_for_operation(client.upgrade("py-quickstart", "1.30.0"), timeout=300)
        print("upgrade:", client.operation_pb2.OperationState.Name(upgraded.state))
        print("version:", client.get_cluster("py-quickstart").status.current_version)
        deleted = client.wait_for_operation(client.delete("py-quickstart"), timeout=120)
        print("delete:", client.operation_pb2.OperationState.Name(deleted.state))


if __name__ == "__main__":
    main()
