"""Chapter 5, the optimizer: minitfm's AdamW against torch.optim.AdamW (float64)."""

import pytest
import torch
from torch import nn

from minitfm.book.optim import AdamW

DTYPE = torch.float64


def small_model(seed=0) -> nn.Module:
    """Matrices (decayed), biases and a norm's γ (not decayed), and a tied weight."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(7, 5), nn.Linear(5, 5), nn.LayerNorm(5), nn.Linear(5, 7))
    model[3].weight = model[0].weight  # tied: one parameter, listed once
    return model.to(DTYPE)


def torch_adamw(model, lr, weight_decay):
    """torch's AdamW with groups named here: the embedding (tied to the output) and the hidden
    matrix decayed; biases and the norm's γ and β not; betas (0.9, 0.98) as the paper's §5.3."""
    embedding, hidden, norm, output = model
    decay = [embedding.weight, hidden.weight]  # output.weight is embedding.weight
    no_decay = [hidden.bias, norm.weight, norm.bias, output.bias]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-8, foreach=False)


def loss_of(model, step):
    tokens = torch.randint(0, 7, (4, 3), generator=torch.Generator().manual_seed(step))
    return model(tokens).square().mean()


@pytest.mark.parametrize("max_norm", [None, 0.05])
def test_adamw_equals_torch_adamw_with_decay_on_matrices_and_clipping(max_norm):
    ours_model, ref_model = small_model(), small_model()
    ours = AdamW(ours_model, lr=0.01, weight_decay=0.1)
    ref = torch_adamw(ref_model, lr=0.01, weight_decay=0.1)
    for step in range(6):
        ours.lr = ref.param_groups[0]["lr"] = ref.param_groups[1]["lr"] = 0.01 * (step + 1) / 6
        ours.zero_grad()
        loss_of(ours_model, step).backward()
        norm = ours.step(max_norm)
        ref.zero_grad()
        loss_of(ref_model, step).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(),
                                                  max_norm if max_norm else float("inf"))
        ref.step()
        torch.testing.assert_close(norm, ref_norm, rtol=1e-12, atol=0)
        for a, b in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_parameters_are_views_of_the_flat_vector():
    model = small_model()
    optimizer = AdamW(model, lr=0.1, weight_decay=0.0)
    assert optimizer.flat.numel() == sum(p.numel() for p in model.parameters())
    optimizer.flat.zero_()
    assert all(torch.all(p == 0) for p in model.parameters())


def test_a_state_for_another_model_is_refused():
    optimizer = AdamW(small_model(), lr=0.1, weight_decay=0.0)
    state = {"step": 1, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
    with pytest.raises(ValueError, match="shape"):
        optimizer.load_state_dict(state)
