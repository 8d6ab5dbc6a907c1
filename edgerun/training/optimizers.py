"""Optimizers as IR: each emits a weight's update and its moments' updates into the train_step graph.

The arithmetic follows torch.optim (SGD with momentum and L2 weight decay, Adam with bias correction and L2
weight decay), so a step from the same weights and gradients lands on torch's weights up to float32
rounding. Moments are program state named after their weight ("<weight>.momentum", "<weight>.exp_avg",
"<weight>.exp_avg_sq"), zero at the start as torch's are.

A step whose loss or gradients are not finite must leave every weight and moment as it was. Rather than a
`where(finite, new, old)` over each weight and moment (a pass over each, and an update that can never be
written over its old value), the flag picks scalars: the gradient is zeroed where it is not finite (one
`where` over the gradient), the decay factors become 1 and the step size 0, so the same arithmetic returns
the old values exactly (m * 1 + 0 = m, w - 0 * u = w). Each update is then an elementwise op over its old
value that nothing reads afterwards, which a backend may write over the state's own buffer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent: buf = momentum * buf + (g + weight_decay * w); w -= lr * buf."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise EdgerunError(f"SGD needs lr > 0, 0 <= momentum < 1 and weight_decay >= 0, got {self}")

    def slots(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def emit(self, b: Builder, w: str, g: str, slots: dict[str, str], lr: str, step: str,
             finite: str) -> tuple[str, dict[str, str]]:
        """(new weight, new value of each slot); `lr` is a 0-d value, `step` this step's number from 1,
        `finite` the 0-d flag that the step applies (else every value comes back unchanged)."""
        if self.weight_decay:
            g = b.binary("add", g, b.binary("mul", w, b.scalar(self.weight_decay, w)))
        g = guarded(b, finite, g)
        new: dict[str, str] = {}
        if self.momentum:
            g = b.binary("add", b.binary("mul", slots["momentum"], either(b, finite, self.momentum, 1.0, w)), g)
            new["momentum"] = g
        return b.binary("sub", w, b.binary("mul", g, b.emit("where", [finite, lr, b.scalar(0.0, lr)]))), new


@dataclass(frozen=True)
class Adam:
    """Adam (torch.optim.Adam): moments of the gradient (plus weight_decay * w), bias-corrected."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        if not self.lr > 0 or not (0 <= b1 < 1 and 0 <= b2 < 1) or not self.eps > 0 or self.weight_decay < 0:
            raise EdgerunError(f"Adam needs lr > 0, betas in [0, 1), eps > 0 and weight_decay >= 0, got {self}")

    def slots(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def emit(self, b: Builder, w: str, g: str, slots: dict[str, str], lr: str, step: str,
             finite: str) -> tuple[str, dict[str, str]]:
        b1, b2 = self.betas
        if self.weight_decay:
            g = b.binary("add", g, b.binary("mul", w, b.scalar(self.weight_decay, w)))
        g = guarded(b, finite, g)
        m = b.binary("add", b.binary("mul", slots["exp_avg"], either(b, finite, b1, 1.0, w)),
                     b.binary("mul", g, b.scalar(1 - b1, w)))
        v = b.binary("add", b.binary("mul", slots["exp_avg_sq"], either(b, finite, b2, 1.0, w)),
                     b.binary("mul", b.binary("mul", g, g), b.scalar(1 - b2, w)))
        one = b.scalar(1.0, step)
        correction1 = b.binary("sub", one, b.binary("pow", b.scalar(b1, step), step))
        correction2 = b.binary("sub", one, b.binary("pow", b.scalar(b2, step), step))
        denom = b.binary("add", b.binary("div", b.unary("sqrt", v), b.unary("sqrt", correction2)), b.scalar(self.eps, w))
        step_size = b.emit("where", [finite, b.binary("div", lr, correction1), b.scalar(0.0, lr)])
        return b.binary("sub", w, b.binary("mul", b.binary("div", m, denom), step_size)), {"exp_avg": m, "exp_avg_sq": v}


Optimizer = SGD | Adam


def guarded(b: Builder, finite: str, g: str) -> str:
    """`g` where the step applies, zeros where it does not (a non-finite gradient must not reach a moment)."""
    return b.emit("where", [finite, g, b.scalar(0.0, g)])


def either(b: Builder, finite: str, applied: float, skipped: float, like: str) -> str:
    """A 0-d factor of `like`'s dtype: `applied` when the step applies, else `skipped`."""
    return b.emit("where", [finite, b.scalar(applied, like), b.scalar(skipped, like)])


def optimizer_to_json(optimizer: Optimizer) -> dict[str, Any]:
    """The optimizer as stored in a training program's metadata."""
    return {"kind": type(optimizer).__name__, **asdict(optimizer)}


def optimizer_from_json(data: Any) -> Optimizer:
    """Inverse of optimizer_to_json; EdgerunError for anything else."""
    try:
        fields = {k: v for k, v in data.items() if k != "kind"}
        if data["kind"] == "SGD":
            return SGD(**fields)
        if data["kind"] == "Adam":
            return Adam(**{**fields, "betas": tuple(fields["betas"])})
    except (AttributeError, KeyError, TypeError) as exc:
        raise EdgerunError(f"the program's optimizer record {data!r} is not one edgerun wrote") from exc
    raise EdgerunError(f"unknown optimizer {data.get('kind')!r} in the program's metadata")
