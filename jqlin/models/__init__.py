"""Reference models built on jqlin layers."""

from .llama import GenerateOutput, Llama, LlamaConfig, from_checkpoint

__all__ = ["Llama", "LlamaConfig", "GenerateOutput", "from_checkpoint"]
