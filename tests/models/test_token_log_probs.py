"""Chunked selective log-softmax: the same values and gradients as log_softmax(logits.float()).gather(...)."""
import pytest
import torch

from spo_lake.models.sampling import gather_token_log_probs


def reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def values_and_grad(fn, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    leaf = logits.detach().clone().requires_grad_()
    out = fn(leaf[:, :-1], targets)  # the trainer's slice of the logits: not contiguous
    (out * weights).sum().backward()
    return out.detach(), leaf.grad


@pytest.mark.parametrize("chunk_elements", [1, 3 * 37, 5 * 37, 2**24])  # one position .. whole batch per chunk
def test_chunked_log_probs_and_gradients_match_the_full_log_softmax(chunk_elements):
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 8, 37, generator=g)
    targets = torch.randint(0, 37, (3, 7), generator=g)
    weights = torch.randn(3, 7, generator=g)
    fast, fast_grad = values_and_grad(lambda x, t: gather_token_log_probs(x, t, chunk_elements), logits, targets,
                                      weights)
    full, full_grad = values_and_grad(reference, logits, targets, weights)
    assert fast.dtype == torch.float32 and fast.shape == (3, 7)
    torch.testing.assert_close(fast, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast_grad, full_grad, rtol=0, atol=1e-5)
    assert fast_grad[:, -1].abs().sum() == 0  # the unused last position gets no gradient


def test_other_shapes_and_bfloat16_logits_are_scored_in_float32():
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(5, 37, generator=g).to(torch.bfloat16)  # a sampling step: [B, V] and [B]
    targets = torch.randint(0, 37, (5,), generator=g)
    torch.testing.assert_close(gather_token_log_probs(rows, targets, 2 * 37), reference(rows, targets),
                               rtol=0, atol=1e-5)
    single = torch.randn(37, generator=g)  # one position: [V] and a scalar target
    assert gather_token_log_probs(single, torch.tensor(4)).shape == ()
    torch.testing.assert_close(gather_token_log_probs(single, torch.tensor(4)), reference(single, torch.tensor(4)))

    leaf = rows.clone().requires_grad_()
    gather_token_log_probs(leaf, targets, 37).sum().backward()
    assert leaf.grad.dtype == torch.bfloat16  # the gradient comes back in the logits' dtype, not a float32 copy
