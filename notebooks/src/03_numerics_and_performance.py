# %% [markdown]
# # Numerics and performance
#
# 1. Quantization error of every format on realistic weight distributions.
# 2. Batch invariance: default vs deterministic mode.
# 3. The committed H200 benchmark results: speedup over bf16 `jnp.dot` by M and the fraction
#    of the roofline reached (the numbers come from `benchmarks/results/`, measured on the
#    device; this notebook only plots them).

# %%
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import jax.numpy as jnp
from IPython.display import Image, display
import jqlin
from safetensors.numpy import load_file

rng = np.random.default_rng(0)
# Weights with per-row/per-column magnitude spread and heavy tails, like trained LLM linears,
# plus the real layers of the shipped tiny Llama.
def llm_like(n, k):
    w = rng.standard_t(df=4, size=(n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * np.exp(0.3 * rng.standard_normal((1, k)))
    return (0.02 * w).astype(np.float32)
tiny = load_file("examples/tiny_llama_bf16/model.safetensors")
weights = {"student-t 1024x1024": llm_like(1024, 1024),
           "tiny llama mlp.down_proj": tiny["model.layers.0.mlp.down_proj.weight"].astype(np.float32),
           "tiny llama self_attn.q_proj": tiny["model.layers.0.self_attn.q_proj.weight"].astype(np.float32)}

# %%
names = jqlin.formats.names()
errs = {}
for label, w in weights.items():
    x = rng.standard_normal((32, w.shape[1])).astype(np.float32)
    ref = x @ w.T
    row = {}
    for name in names:
        qw = jqlin.quantize(w, name, calibration=x)
        y = np.asarray(jqlin.matmul(x, qw))
        row[name] = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    errs[label] = row
fig, ax = plt.subplots(figsize=(11, 3.5))
width = 0.8 / len(errs)
for i, (label, row) in enumerate(errs.items()):
    ax.bar(np.arange(len(names)) + i * width, [row[n] for n in names], width, label=label)
ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=30, ha="right")
ax.set_ylabel("relative error of x @ W.T"); ax.set_yscale("log"); ax.legend(fontsize=8)
ax.set_title("matmul error vs float, per format (activations quantized where the format says)")
fig.tight_layout(); fig.savefig("/tmp/jqlin_errors.png", dpi=80); plt.close(fig)
display(Image("/tmp/jqlin_errors.png"))
for label, row in errs.items():
    print(f"{label:<28}", " ".join(f"{n}={v:.3f}" for n, v in row.items()))

# %% [markdown]
# Batch invariance: the same row, alone and inside batches of other rows. Default mode may
# change its last bits with the batch (XLA picks its dot strategy by shape); deterministic
# mode may not.

# %%
qw = jqlin.quantize(weights["student-t 1024x1024"], "fp8_block")
xs = jnp.asarray(rng.standard_normal((300, 1024)), jnp.float32)
for det in (False, True):
    alone = np.asarray(jqlin.matmul(xs[:1], qw, deterministic=det))[0]
    diffs = [int(np.sum(np.asarray(jqlin.matmul(xs[:m], qw, deterministic=det))[0] != alone))
             for m in (2, 7, 64, 300)]
    print(f"deterministic={det}: output elements of row 0 that differ from M=1, for M=2,7,64,300: {diffs}")

# %% [markdown]
# The committed H200 results. Each JSON file under `benchmarks/results/` records the device,
# its measured copy bandwidth and, per (shape, M, kernel), the median time, TFLOP/s, fraction
# of copy bandwidth on the weight bytes and the speedup over bf16 `jnp.dot` measured in the
# same run.

# %%
sys.path.insert(0, "benchmarks")
from report import current_records  # the newest run of each (kernel, M); REPORT.md uses it too

records = current_records()
print(len(records), "records from", sorted({r["source"] for r in records}))

def geomean(v):
    return float(np.exp(np.mean(np.log(v))))

series = {}
for r in records:
    if r.get("format") and r.get("speedup_vs_bf16"):
        series.setdefault(r["label"], {}).setdefault(r["M"], []).append(r["speedup_vs_bf16"])
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for label, by_m in sorted(series.items()):
    ms = sorted(by_m)
    axes[0].plot(ms, [geomean(by_m[m]) for m in ms], marker="o", label=label)
axes[0].axhline(1.0, color="k", lw=0.8); axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("M (tokens)"); axes[0].set_ylabel("speedup vs bf16 jnp.dot (geomean over shapes)")
axes[0].legend(fontsize=6, ncol=2)
small = [r for r in records if r.get("format") and r["M"] <= 16 and r.get("frac_copy_bw")]
by_label = {}
for r in small:
    by_label.setdefault(r["label"], []).append(r["frac_copy_bw"])
labels = sorted(by_label)
axes[1].barh(labels, [np.median(by_label[l]) for l in labels])
axes[1].set_xlabel("fraction of measured copy bandwidth on weight bytes (median, M <= 16)")
axes[1].tick_params(axis="y", labelsize=6)
fig.tight_layout(); fig.savefig("/tmp/jqlin_bench.png", dpi=80); plt.close(fig)
display(Image("/tmp/jqlin_bench.png"))
