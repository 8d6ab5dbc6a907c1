"""On-device training against torch eager: ms per train step at batch 32 and peak RSS, the digits task, and
whole-model gradient checks.

    PYTHONPATH=$PWD .venv/bin/python bench/training.py [--steps 30] [--threads 2] [--models mlp,din,digits]
        [--digits] [--gradients] [--memory mlp,digits,din,minilm2,minilm2-frozen] [--mnn] [--out bench/results/training.json]

The speed table goes to --out, the gradient checks to training_gradients.json and the digits run to
training_digits.json beside it.

Speed: each (system, model) runs alone in a fresh process (`--worker`), so peak RSS (ru_maxrss) is that
system's alone; edgerun's worker loads a training program file saved beforehand (`--prepare`) with numpy
alone, no torch imported. A step is one optimizer step (SGD, momentum 0.9) on a batch of 32 from the same
weights, the median of `--steps` steps after 5 warm-up steps. Systems: edgerun's training program on ONNX Runtime and
on the numpy reference, torch eager (zero_grad, forward, loss, backward, step), and ExecuTorch's training path
(executorch.extension.training, requirements-bench.txt: the module and loss exported with torch.export's joint
forward-backward graph to a .pte in the --prepare process; the timed process loads it, runs forward_backward
and its SGD optimizer; its portable CPU kernels, no delegate, as its training example does). A model ExecuTorch
cannot export or run is reported with the reason (the kernel its runtime lacks). Threads: 2 everywhere
(torch.set_num_threads, EDGERUN_ORT_THREADS, the BLAS variables).
--digits: the digits CNN (32, 64, 128 wide) trained from scratch on the device for 20 epochs (Adam 2e-3, a
cosine schedule given as the learning-rate input), held-out accuracy per epoch.
--memory mlp,digits,din,minilm2,minilm2-frozen: recompute versus keep versus a memory budget (passes/autodiff.py's
recompute_cheap and recompute_to_budget, the budget half of recompute_cheap's kept bytes): the forward
activation bytes backward holds, train_step's planned arena, the ms per step on ONNX Runtime (interleaved in
one process) and whether the gradients are equal bit for bit.
--mnn: MNN's own training path (MNN.nn, MNN.optim; the MLP rebuilt in its layer API, as MNN cannot train an
imported model from Python), in its own process; reported as training only if the loss and the weights move.
--gradients: the gradient of every parameter of the zoo's MLP, DIN, the digits CNN, MobileNetV2 (32x32
inputs, 10 classes) and MiniLM (16 tokens) against torch.autograd: the worst error of any parameter,
relative to that parameter's largest gradient (plus 1e-3 of the model's largest, for gradients that are
zero in exact arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np

BATCH = 32
SYSTEMS = ("edgerun-ort", "edgerun-reference", "torch", "executorch")


def _model(name: str) -> tuple[Any, tuple[Any, ...], Any, str]:
    """(module in eval mode, example inputs at batch 32, targets, loss)."""
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        from edgerun.zoo.mlp import MLP

        return MLP().eval(), (torch.randn(BATCH, 1, 28, 28),), torch.randint(0, 10, (BATCH,)), "cross_entropy"
    if name == "digits":
        from edgerun.zoo.digits_cnn import DigitsCNN

        return DigitsCNN(32, 64, 128).eval(), (torch.rand(BATCH, 1, 8, 8),), torch.randint(0, 10, (BATCH,)), \
            "cross_entropy"
    if name == "din":
        from edgerun.zoo.din import DIN, example_inputs

        inputs = tuple(torch.cat([i] * BATCH) for i in example_inputs())
        return DIN().eval(), inputs, torch.randint(0, 2, (BATCH,)).float(), "bce"
    raise SystemExit(f"unknown model {name!r}")


def prepare(name: str, workdir: str) -> None:
    """Build the training program (SGD, momentum 0.9) and save it with its batch: the timed process then
    loads a file with numpy alone, as a device would, so its peak RSS holds no torch."""
    import edgerun.training as T

    module, inputs, targets, loss = _model(name)
    loss_fn = torch_bce() if loss == "bce" else loss
    model = T.from_torch(module, inputs, loss=loss_fn, example_targets=targets if loss == "bce" else None,
                         optimizer=T.SGD(0.01, momentum=0.9))
    model.save(os.path.join(workdir, f"{name}.train.edgerun"))
    np.savez(os.path.join(workdir, f"{name}.batch.npz"), *[i.numpy() for i in inputs], targets.numpy())
    prepare_executorch(name, workdir)


def prepare_executorch(name: str, workdir: str) -> None:
    """ExecuTorch's training path (its CIFAR example's): the module and its loss exported together,
    torch.export's joint forward-backward graph, lowered to edge and to a .pte whose method returns the loss,
    the gradients and the parameters. A failure is written beside it for the table to show."""
    import torch

    module, inputs, targets, loss = _model(name)
    fn = torch_bce() if loss == "bce" else torch.nn.functional.cross_entropy
    path = os.path.join(workdir, f"{name}.pte")
    try:
        from executorch.exir import EdgeCompileConfig, to_edge
        from torch.export.experimental import _export_forward_backward

        ep = _export_forward_backward(torch.export.export(with_loss(module, fn), (*inputs, targets), strict=True))
        program = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
        with open(path, "wb") as f:
            f.write(program.buffer)
    except Exception as exc:  # an export failure is a result of the comparison, not of this script
        with open(path + ".error", "w") as f:
            f.write(f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def with_loss(net: Any, loss: Any) -> Any:
    """The module followed by its loss, as one module (what ExecuTorch exports for training)."""
    import torch

    class _Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *args: Any) -> Any:
            *inputs, target = args
            return loss(self.net(*inputs), target)

    return _Module()


def torch_bce() -> Any:
    import torch

    return torch.nn.functional.binary_cross_entropy


def worker(system: str, name: str, steps: int, threads: int, workdir: str) -> dict[str, Any]:
    times = []
    build = 0.0
    if system == "torch":
        import torch

        torch.set_num_threads(threads)
        module, inputs, targets, loss = _model(name)
        loss_fn = torch_bce() if loss == "bce" else torch.nn.functional.cross_entropy
        opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        for _ in range(steps + 5):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss_fn(module(*inputs), targets).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    elif system == "executorch":
        import torch
        from executorch.extension.training import _load_for_executorch_for_training, get_sgd_optimizer

        path = os.path.join(workdir, f"{name}.pte")
        if not os.path.exists(path):
            with open(path + ".error") as f:
                return {"error": f.read()}
        torch.set_num_threads(threads)
        _, inputs, targets, _ = _model(name)
        t0 = time.perf_counter()
        model = _load_for_executorch_for_training(path)
        build = time.perf_counter() - t0
        optimizer = None
        for _ in range(steps + 5):
            t0 = time.perf_counter()
            model.forward_backward("forward", (*inputs, targets))  # fails naming a missing kernel, if any
            if optimizer is None:  # the parameters are known once a step has run (ExecuTorch's API)
                optimizer = get_sgd_optimizer(model.named_parameters(), 0.01, 0.9, 0, 0, False)
            optimizer.step(model.named_gradients())
            times.append(time.perf_counter() - t0)
    else:
        from edgerun.training import TrainingProgram

        backends = ["onnxruntime"] if system == "edgerun-ort" else ["reference"]
        t0 = time.perf_counter()
        model = TrainingProgram.read(os.path.join(workdir, f"{name}.train.edgerun"), backends)
        build = time.perf_counter() - t0
        with np.load(os.path.join(workdir, f"{name}.batch.npz")) as batch:
            arrays = [batch[f"arr_{i}"] for i in range(len(batch.files))]
        for _ in range(steps + 5):
            t0 = time.perf_counter()
            model.train_step(*arrays)
            times.append(time.perf_counter() - t0)
        assert "torch" not in sys.modules, "the edgerun worker imported torch"
    return {"ms_per_step": 1000 * statistics.median(times[5:]), "load_s": build,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def speed(models: list[str], steps: int, threads: int) -> dict[str, Any]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "EDGERUN_ORT_THREADS"):
        env[var] = str(threads)
    results: dict[str, Any] = {}
    workdir = tempfile.mkdtemp(prefix="edgerun-training-bench-")
    for name in models:
        subprocess.run([sys.executable, __file__, "--prepare", name, workdir], env=env, check=True,
                       capture_output=True)
    print(f"## Train step at batch {BATCH}, {threads} threads (median of {steps}; load average "
          f"{os.getloadavg()[0]:.2f} at the start)")
    print("| model | edgerun (ORT) ms | edgerun (reference) ms | torch eager ms | ExecuTorch ms | ORT / torch | "
          "RSS edgerun (ORT) MB | RSS torch MB | RSS ExecuTorch MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in models:
        row = {}
        for system in SYSTEMS:
            out = subprocess.run([sys.executable, __file__, "--worker", system, name, "--steps", str(steps),
                                  "--threads", str(threads), "--workdir", workdir], capture_output=True, text=True,
                                 env=env, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None and system == "executorch":  # its runtime logs the kernel it lacks, then raises
                missing = sorted({x.split("Missing operator:")[1].split("]")[-1].strip()
                                  for x in out.stderr.splitlines() if "Missing operator:" in x})
                row[system] = {"error": "run failed: the runtime has no kernel for " + ", ".join(missing)
                               if missing else "run failed: " + out.stderr.strip().splitlines()[-1][:300]}
                continue
            if line is None:
                raise SystemExit(f"{system} on {name} failed:\n{out.stderr[-2000:]}")
            row[system] = json.loads(line[len("RESULT "):])
        results[name] = row
        ort, ref, tor, et = row["edgerun-ort"], row["edgerun-reference"], row["torch"], row["executorch"]
        et_ms = f"{et['ms_per_step']:.2f}" if "error" not in et else "fails"
        et_rss = f"{et['peak_rss_mb']:.0f}" if "error" not in et else "-"
        print(f"| {name} | {ort['ms_per_step']:.2f} | {ref['ms_per_step']:.2f} | {tor['ms_per_step']:.2f} | "
              f"{et_ms} | {ort['ms_per_step'] / tor['ms_per_step']:.2f} | {ort['peak_rss_mb']:.0f} | "
              f"{tor['peak_rss_mb']:.0f} | {et_rss} |")
    for name in models:
        if "error" in results[name]["executorch"]:
            print(f"ExecuTorch on {name}: {results[name]['executorch']['error']}")
    return results


def digits_run(threads: int) -> dict[str, Any]:
    import torch

    import edgerun.training as T
    from edgerun.zoo.digits_cnn import DigitsCNN, digits

    os.environ.setdefault("EDGERUN_ORT_THREADS", str(threads))
    (xtr, ytr), (xte, yte) = digits()
    torch.manual_seed(0)
    module = DigitsCNN(32, 64, 128).eval()
    lr, epochs = 2e-3, 20
    model = T.from_torch(module, (xtr[:BATCH],), optimizer=T.Adam(lr), backends=["onnxruntime"])
    inference, _ = T.export_for_training(module, (xte,))
    x, y, xt, yt = xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy()
    rng = np.random.default_rng(0)
    per_epoch = len(y) // BATCH
    total, step, t0 = epochs * per_epoch, 0, time.perf_counter()
    history = []
    print(f"## Digits CNN from scratch ({len(y)} training images, {len(yt)} held out), Adam {lr}, cosine schedule")
    print("| epoch | mean loss | held-out accuracy |")
    print("|---:|---:|---:|")
    for epoch in range(epochs):
        order = rng.permutation(len(y))
        losses = []
        for i in range(per_epoch):
            idx = order[i * BATCH:(i + 1) * BATCH]
            rate = lr * 0.5 * (1 + np.cos(np.pi * step / total))
            losses.append(model.train_step(x[idx], y[idx], lr=float(rate)))
            step += 1
        accuracy = float((_run(T.apply_weights(inference, model.weights), xt).argmax(1) == yt).mean())
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)), "accuracy": accuracy})
        print(f"| {epoch + 1} | {np.mean(losses):.4f} | {accuracy:.4f} |")
    seconds = time.perf_counter() - t0
    print(f"final held-out accuracy {history[-1]['accuracy']:.4f}; {step} steps in {seconds:.1f} s "
          f"(evaluation included)")
    return {"history": history, "steps": step, "seconds": seconds}


def _run(program: Any, x: np.ndarray) -> np.ndarray:
    import edgerun

    return np.asarray(edgerun.load(program)(x))


def gradients() -> dict[str, Any]:
    import torch
    from torch import nn

    import edgerun.training as T

    def case(name: str) -> tuple[Any, tuple[Any, ...], Any, Any]:
        torch.manual_seed(0)
        if name == "mobilenetv2":
            from edgerun.zoo.mobilenet import MobileNetV2

            return MobileNetV2(10).eval(), (torch.randn(2, 3, 32, 32),), torch.tensor([1, 7]), "cross_entropy"
        if name == "minilm":
            from edgerun.zoo.minilm import EXAMPLE_SENTENCES, build, tokenize

            return build(), tokenize(EXAMPLE_SENTENCES[:2], 16), torch.randn(2, 384) * 0.05, nn.functional.mse_loss
        module, inputs, targets, loss = _model(name)
        return module, inputs, targets, nn.functional.binary_cross_entropy if loss == "bce" else loss

    results: dict[str, Any] = {}
    print("## Gradients of every parameter against torch.autograd")
    print("| model | parameters compared | worst error (relative) | build s | gradients s |")
    print("|---|---:|---:|---:|---:|")
    for name in ("mlp", "din", "digits", "mobilenetv2", "minilm"):
        module, inputs, targets, loss = case(name)
        t0 = time.perf_counter()
        model = T.from_torch(module, inputs, loss=loss, example_targets=None if isinstance(loss, str) else targets,
                             optimizer=T.SGD(0.1), backends=["onnxruntime"])
        t1 = time.perf_counter()
        ours = model.gradients(*(i.numpy() for i in inputs), targets.numpy())
        t2 = time.perf_counter()
        fn = nn.functional.cross_entropy if loss == "cross_entropy" else loss
        module.zero_grad()
        fn(module(*inputs), targets).backward()
        refs = {n: p.grad.numpy() for n, p in module.named_parameters() if p.grad is not None and n in ours}
        scale = max(float(np.abs(r).max()) for r in refs.values())
        worst = 0.0
        for n, ref in refs.items():
            got = ours[n]
            worst = max(worst, float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-3 * scale)))
        results[name] = {"parameters": len(refs), "worst": worst, "build_s": t1 - t0, "gradients_s": t2 - t1}
        print(f"| {name} | {len(refs)} | {worst:.2e} | {t1 - t0:.1f} | {t2 - t1:.2f} |")
    return results


def memory(models: list[str], threads: int) -> dict[str, Any]:
    """Recompute versus keep versus a memory budget: the activation bytes backward holds and the planned
    arenas (the reference's plan, where edgerun places every value) of train_step with recompute off, with
    recompute_cheap, and with activation_budget at half of recompute_cheap's kept bytes (recompute_to_budget);
    the gradients compared; and the ms per train step of each on ONNX Runtime, the three interleaved step by
    step in one process (so load shifts all three alike)."""
    import torch

    import edgerun.training as T

    def case(name: str) -> tuple[Any, tuple[Any, ...], Any, Any]:
        if name.startswith("minilm2"):  # MiniLM's first two layers (384 wide, 1536 FFN, 12 heads), 8 x 32 tokens
            from edgerun.zoo.minilm import EXAMPLE_SENTENCES, build, tokenize

            torch.manual_seed(0)
            module = build()
            module.encoder.encoder.layer = module.encoder.encoder.layer[:2]
            sentences = (list(EXAMPLE_SENTENCES) * 8)[:8]
            return module, tokenize(sentences, 32), torch.randn(8, 384) * 0.05, torch.nn.functional.mse_loss
        module, inputs, targets, loss = _model(name)
        return module, inputs, targets, torch_bce() if loss == "bce" else loss

    os.environ.setdefault("EDGERUN_ORT_THREADS", str(threads))
    results: dict[str, Any] = {}
    print(f"## Recompute versus keep versus a budget (train_step; arenas planned on the reference, ms on ONNX "
          f"Runtime at {threads} threads, load average {os.getloadavg()[0]:.2f} at the start)")
    print("| model | variant | kept for backward B | train_step arena B | ms per step (ORT) | gradients equal to keep-all |")
    print("|---|---|---:|---:|---:|---|")
    for name in models:
        module, inputs, targets, loss = case(name)
        # minilm2-frozen: the embedding tables frozen (their gradient, 47 MB for the word table, is otherwise
        # the arena's peak, whatever backward keeps)
        train = (lambda n: "embeddings" not in n) if name == "minilm2-frozen" else None
        batch = [*(i.numpy() for i in inputs), targets.numpy()]
        row: dict[str, Any] = {}
        grads, timed = [], []
        for variant in ("keep", "recompute", "budget"):
            budget = row["recompute"]["kept_bytes"] // 2 if variant == "budget" else None
            common = dict(loss=loss, example_targets=None if isinstance(loss, str) else targets,
                          trainable_params=train, optimizer=T.SGD(0.01), recompute=variant != "keep",
                          activation_budget=budget)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a budget below the floor: the floor is the result
                model = T.from_torch(module, inputs, backends=["reference"], **common)
            kept = model.program.metadata["training"]["activation_bytes"]["kept_for_backward"]
            arena = model.loaded.method("train_step").arena_bytes
            row[variant] = {"kept_bytes": kept, "train_step_arena_bytes": arena, "budget_bytes": budget}
            grads.append(model.gradients(*batch))
            timed.append(T.TrainingProgram(model.program, model.layout, model.optimizer, ["onnxruntime"]))
        times: list[list[float]] = [[] for _ in timed]
        for step in range(25):
            for k, model in enumerate(timed):
                t0 = time.perf_counter()
                model.train_step(*batch)
                if step >= 5:
                    times[k].append(time.perf_counter() - t0)
        for k, variant in enumerate(("keep", "recompute", "budget")):
            row[variant]["ms_per_step"] = 1000 * statistics.median(times[k])
            row[variant]["gradients_equal"] = all(np.array_equal(grads[0][n], grads[k][n]) for n in grads[0])
            v = row[variant]
            label = f"budget {v['budget_bytes']:,} B" if variant == "budget" else variant
            print(f"| {name} | {label} | {v['kept_bytes']:,} | {v['train_step_arena_bytes']:,} | {v['ms_per_step']:.2f} | "
                  f"{'bit for bit' if v['gradients_equal'] else 'NO'} |")
        results[name] = row
    return results


MNN_STEPS = 6


def mnn_worker() -> dict[str, Any]:
    """MNN's own training path (its Python Express API: MNN.nn layers, MNN.optim.SGD, as its MNIST example
    trains): the MLP 784-256-256-10 rebuilt in MNN's layer API (MNN has no importer of a torch or ONNX
    model for training), SGD(0.1, momentum 0.9) on one batch of 32. It counts as training only if the loss
    and the weights move."""
    import MNN.expr as F
    import MNN.nn as nn
    import MNN.optim as optim

    class Net(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.linear(784, 256), nn.linear(256, 256), nn.linear(256, 10)

        def forward(self, x: Any) -> Any:
            return F.softmax(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), 1)

    rng = np.random.default_rng(0)
    net = Net()
    net.train(True)
    sgd = optim.SGD(net, 0.1, 0.9, 0.0)
    x = F.const(rng.random((BATCH, 784), dtype=np.float32).ravel().tolist(), [BATCH, 784], F.NCHW)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    target = F.one_hot(F.const(labels.tolist(), [BATCH], F.NCHW, F.int), 10, 1.0, 0.0)
    weights = lambda: np.concatenate([np.array(p.read(), np.float32).ravel() for p in net.parameters])  # noqa: E731
    before, losses, times = weights(), [], []
    for _ in range(MNN_STEPS):
        t0 = time.perf_counter()
        loss = nn.loss.cross_entropy(net.forward(x), target)
        sgd.step(loss)
        losses.append(float(np.array(loss.read())))
        times.append(time.perf_counter() - t0)
    moved = float(np.abs(weights() - before).max())
    if moved == 0.0 or len(set(losses)) == 1:
        return {"error": f"MNN's Express training (MNN.optim.SGD.step) left the weights unchanged (largest change "
                         f"of any of its {len(net.parameters)} parameters {moved}) and the loss at {losses[0]:.4f} over {MNN_STEPS} steps: nothing trained, "
                         "nothing to time", "losses": losses}
    return {"ms_per_step": 1000 * statistics.median(times), "losses": losses,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def mnn() -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--mnn-worker"], capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    result = json.loads(line[len("RESULT "):]) if line else {"error": out.stderr.strip().splitlines()[-1][:300]}
    print("## MNN's training path (MLP 784-256-256-10, its own layer API, SGD)")
    print(result.get("error") or f"{result['ms_per_step']:.2f} ms per step, losses {result['losses']}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "MODEL"))
    ap.add_argument("--prepare", nargs=2, metavar=("MODEL", "DIR"))
    ap.add_argument("--workdir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="mlp,din,digits", help="the speed table's models ('' for none)")
    ap.add_argument("--digits", action="store_true", help="also train the digits CNN to accuracy")
    ap.add_argument("--gradients", action="store_true", help="also check whole-model gradients against torch")
    ap.add_argument("--memory", default="", help="also compare recompute with keep on these models "
                    "(mlp,din,digits,minilm2: MiniLM's first two layers, minilm2-frozen: its embeddings frozen)")
    ap.add_argument("--mnn", action="store_true", help="also try MNN's own training path (its Express API)")
    ap.add_argument("--mnn-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/results/training.json")
    args = ap.parse_args()
    if args.prepare:
        prepare(*args.prepare)
        return
    if args.mnn_worker:
        print("RESULT " + json.dumps(mnn_worker()))
        return
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], args.worker[1], args.steps, args.threads, args.workdir)))
        return
    meta = {"command": "bench/training.py " + " ".join(sys.argv[1:]), "cpus": os.cpu_count(),
            "threads": args.threads, "batch": BATCH}
    sections: dict[str, Any] = {}
    if args.models:
        sections[args.out] = lambda: {"speed": speed([m for m in args.models.split(",") if m], args.steps,
                                                      args.threads)}
    stem = args.out.removesuffix(".json")
    if args.gradients:
        sections[f"{stem}_gradients.json"] = lambda: {"gradients": gradients()}
    if args.memory:
        sections[f"{stem}_memory.json"] = lambda: {"memory": memory(args.memory.split(","), args.threads)}
    if args.mnn:
        sections[f"{stem}_mnn.json"] = lambda: {"mnn": mnn()}
    if args.digits:
        sections[f"{stem}_digits.json"] = lambda: {"digits": digits_run(args.threads)}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    for path, run in sections.items():  # one results file per section, each with its own load average
        record = {**meta, "loadavg_start": os.getloadavg()[0], **run(), "loadavg_end": os.getloadavg()[0]}
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
