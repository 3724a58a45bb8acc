"""The GRPO-shaped rows the cross-process guard tests write and read (tests/guard/ and the
Mooncake tests): jagged token ids, bf16 logprobs, advantages, a mask and a prompt per row."""
from __future__ import annotations

N = 64
PART = "rollout"


def payload():
    import torch
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(1, 50, (N,), generator=g).tolist()
    return TensorDict({
        "input_ids": torch.nested.nested_tensor(
            [torch.randint(0, 32000, (n,), generator=g) for n in lengths], layout=torch.jagged),
        "logprobs": torch.randn(N, 16, generator=g).to(torch.bfloat16),
        "advantages": torch.randn(N, 1, generator=g).expand(N, 16).contiguous(),
        "mask": torch.rand(N, 16, generator=g) > 0.3,
        "prompt": NonTensorStack(*[f"p{i}" for i in range(N)]),
    }, batch_size=[N])
