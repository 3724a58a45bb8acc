"""A Ray actor written against plain TransferQueue, as a user writes it. The instrumentor's
test measures it through environment variables alone: not a line here changes."""
import torch
import transfer_queue
from tensordict import TensorDict


class RolloutWorker:
    def __init__(self):
        transfer_queue.init()  # finds the running controller: a client only

    def write_and_read(self, n: int) -> list:
        keys = [f"a{i}" for i in range(n)]
        fields = TensorDict({"x": torch.arange(n * 3).reshape(n, 3)}, batch_size=[n])
        transfer_queue.kv_batch_put(keys=keys, partition_id="actor", fields=fields)
        got = transfer_queue.kv_batch_get(keys=keys, partition_id="actor")
        return [r.tolist() for r in got["x"].unbind()]

    def close(self) -> None:
        transfer_queue.get_client().close()
