# %% [markdown]
# # From a Hugging Face checkpoint to generation
#
# `jqlin inspect` and `jqlin convert` on the small Llama shipped in `examples/`, loading the
# result into jqlin's reference Llama, generating, and comparing with the unquantized model.
# A third-party checkpoint (compressed-tensors FP8_BLOCK written by llm-compressor) is loaded
# as stored when the project's shared fixtures are present.

# %%
import pathlib, subprocess, sys, tempfile
import numpy as np
import jqlin
from jqlin.models import llama

SRC = pathlib.Path("examples/tiny_llama_bf16")
work = pathlib.Path(tempfile.mkdtemp())
def cli(*args):
    out = subprocess.run([sys.executable, "-m", "jqlin", *map(str, args)], capture_output=True, text=True)
    print(out.stdout + out.stderr)

# %% [markdown]
# The source is an ordinary bf16 transformers checkpoint: nothing quantized yet.

# %%
cli("inspect", SRC)

# %% [markdown]
# Online quantization into a registered format (streaming, atomic, with a progress bar),
# then `inspect` of the jqlin checkpoint.

# %%
cli("convert", SRC, work / "fp8_block", "--quantize", "fp8_block", "--no-progress")
cli("inspect", work / "fp8_block")

# %% [markdown]
# Load it into the reference Llama (q/k/v and gate/up fused without touching a stored value),
# generate greedily, and compare with the bf16 model.

# %%
q_model = llama.from_checkpoint(work / "fp8_block")
ref_model = llama.from_checkpoint(SRC)
ids = np.array([[1, 17, 93, 250, 7, 311, 42, 5]], np.int32)
print("fp8_block tokens:", np.asarray(q_model.generate(ids, 8).tokens[0]).tolist())
print("bf16 tokens:     ", np.asarray(ref_model.generate(ids, 8).tokens[0]).tolist())
lq, lr = np.asarray(q_model(ids)), np.asarray(ref_model(ids))
print("relative logit error vs bf16:", float(np.linalg.norm(lq - lr) / np.linalg.norm(lr)))

# %% [markdown]
# Which kernel serves each layer, and why (on a CPU the XLA reference; on an H200 the Pallas
# kernels that declare the spec).

# %%
for path, layer in jqlin.nn.quant_layers(q_model).items():
    print(f"{path:<32} {jqlin.formats.name_of(layer.spec):<12} -> {layer.explain((8, layer.in_features)).chosen}")

# %% [markdown]
# A third-party checkpoint, used as stored: compressed-tensors FP8_BLOCK (bf16 block scales,
# partial 128-blocks since hidden = 320). Its layers dequantize exactly to the tool's own
# reference.

# %%
fixture = pathlib.Path("../shared/fixtures/ct_fp8_block")
if fixture.is_dir():
    ck = jqlin.load_checkpoint(fixture)
    print(ck)
    from safetensors.numpy import load_file
    ref = load_file(fixture / "reference" / "dequant.safetensors")
    worst = max(float(np.max(np.abs(np.asarray(qw.dequantize()) - ref[name + ".weight"])))
                for name, qw in ck.layers.items())
    print("max |jqlin dequantize - llm-compressor dequantize| over all layers:", worst)
else:
    print("shared fixtures not present; skipped")
