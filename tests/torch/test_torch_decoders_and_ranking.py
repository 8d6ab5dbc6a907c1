"""Models that need transposed convolutions and ordering ops, exported and run against eager PyTorch:
a small U-Net (ConvTranspose2d decoder), a detector head picking its top scores (topk), one beam-search
step (sort, argsort), and ConvTranspose1d/3d with groups, dilation and output padding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import edgerun
from edgerun.errors import UnsupportedOpError


class TinyUNet(nn.Module):
    """Two down steps and two ConvTranspose2d up steps with skip connections (the U-Net decoder)."""

    def __init__(self) -> None:
        super().__init__()
        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.enc1, self.enc2, self.mid = block(3, 8), block(8, 16), block(16, 32)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = block(32, 16)
        self.up1 = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.dec1 = block(16, 8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


class DetectorHead(nn.Module):
    """Per-anchor class scores; the 10 best boxes by score, their classes and decoded boxes (a gather)."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.cls = nn.Conv2d(16, classes, 1)
        self.box = nn.Conv2d(16, 4, 1)

    def forward(self, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = self.cls(feat).sigmoid().flatten(2)  # [N, C, A]
        best, cls = scores.max(dim=1)  # [N, A]
        top, idx = torch.topk(best, 10, dim=1)
        boxes = self.box(feat).flatten(2).transpose(1, 2)  # [N, A, 4]
        picked = torch.gather(boxes, 1, idx[:, :, None].expand(-1, -1, 4))
        return top, torch.gather(cls, 1, idx), picked


class BeamStep(nn.Module):
    """One step of beam search: extend each beam's log-probability by the next token's, keep the best."""

    def __init__(self, vocab: int = 60, beams: int = 4) -> None:
        super().__init__()
        self.beams, self.vocab = beams, vocab
        self.proj = nn.Linear(16, vocab)

    def forward(self, hidden: torch.Tensor, beam_scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logp = torch.log_softmax(self.proj(hidden), dim=-1)  # [B, beams, V]
        total = (beam_scores[:, :, None] + logp).flatten(1)  # [B, beams * V]
        ranked, order = torch.sort(total, dim=1, descending=True)
        keep = order[:, : self.beams]
        return ranked[:, : self.beams], keep // self.vocab, keep % self.vocab, torch.argsort(logp, dim=-1)


def _same(ours: Any, theirs: tuple[torch.Tensor, ...] | torch.Tensor) -> None:
    ours_list = list(ours) if isinstance(ours, list | tuple) else [ours]
    theirs_t = theirs if isinstance(theirs, tuple) else (theirs,)
    assert len(ours_list) == len(theirs_t)
    for o, t in zip(ours_list, theirs_t):
        ref = t.detach().numpy()
        assert o.shape == ref.shape and o.dtype == ref.dtype
        if ref.dtype.kind in "iub":
            np.testing.assert_array_equal(o, ref)
        else:
            np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-5)


def _seeded(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def test_unet_with_transposed_convolutions_matches_eager() -> None:
    torch.manual_seed(0)
    model = _seeded(TinyUNet())
    x = torch.randn(1, 3, 16, 24)
    program = edgerun.export(model, (x,))
    assert edgerun.export(model, (x,), optimize=False).graph.op_counts()["conv_transpose2d"] == 2
    with torch.no_grad():
        _same(edgerun.load(program)(x.numpy()), model(x))


def test_unet_with_dynamic_height_and_width_matches_eager_at_each_size() -> None:
    torch.manual_seed(1)
    model = _seeded(TinyUNet())
    h, w = Dim("h4", min=1, max=16), Dim("w4", min=1, max=16)
    program = edgerun.export(model, (torch.randn(1, 3, 16, 16),), dynamic_shapes=({2: 4 * h, 3: 4 * w},))
    loaded = edgerun.load(program)
    for size in ((8, 12), (20, 16)):
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            _same(loaded(x.numpy()), model(x))


def test_detector_head_topk_matches_eager() -> None:
    torch.manual_seed(2)
    model = DetectorHead().eval()
    feat = torch.randn(2, 16, 6, 8)
    with torch.no_grad():
        _same(edgerun.load(edgerun.export(model, (feat,)))(feat.numpy()), model(feat))


def test_beam_search_step_sort_matches_eager() -> None:
    torch.manual_seed(3)
    model = BeamStep().eval()
    hidden, scores = torch.randn(2, 4, 16), -torch.rand(2, 4)
    with torch.no_grad():
        _same(edgerun.load(edgerun.export(model, (hidden, scores)))(hidden.numpy(), scores.numpy()),
              model(hidden, scores))


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.ConvTranspose1d(4, 6, 3, stride=3, padding=2, output_padding=1, dilation=2, groups=2), (2, 4, 7)),
    (lambda: nn.ConvTranspose1d(3, 2, 4, stride=2), (3, 5)),  # unbatched
    (lambda: nn.ConvTranspose3d(4, 6, (2, 3, 3), stride=(2, 1, 2), padding=(1, 1, 0), output_padding=(1, 0, 1),
                                dilation=(2, 1, 1), groups=2), (1, 4, 3, 5, 4)),
    (lambda: nn.ConvTranspose3d(2, 3, 3, stride=1, padding=1, bias=False), (2, 2, 4, 3, 3)),
])
def test_transposed_convolutions_1d_3d_match_eager(make, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(4)
    model = make().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        _same(edgerun.load(edgerun.export(model, (x,)))(x.numpy()), model(x))


def test_sort_puts_nan_last_like_torch_and_keeps_ties_in_index_order() -> None:
    class Sorts(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            up, down = torch.sort(x, stable=True), torch.sort(x, descending=True, stable=True)
            return up[0], up[1], down[0], down[1], torch.topk(x, 3, largest=False)[1]

    x = torch.tensor([[2.0, float("nan"), 1.0, 2.0, -float("inf"), 1.0]])
    ours = edgerun.load(edgerun.export(Sorts(), (x,)))(x.numpy())
    for o, t in zip(ours, Sorts()(x)):
        np.testing.assert_array_equal(o, t.numpy())


def test_sort_over_a_long_axis_is_refused_with_the_reason() -> None:
    class Sort(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(x)[0]

    with pytest.raises(UnsupportedOpError, match="pairwise ranking"):
        edgerun.load(edgerun.export(Sort(), (torch.randn(5000),)))(np.zeros(5000, np.float32))
