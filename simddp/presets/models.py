"""Model presets. Transformer shapes come from each model's paper or released config; ResNet-50 is built
layer by layer from the torchvision definition (He et al. 2016, "v1.5" with stride on the 3x3 conv).
"""

from __future__ import annotations

from typing import Any

from simddp.presets import Preset


def _gpt2(num_layers: int, hidden: int, heads: int) -> dict[str, Any]:
    # Radford et al. 2019; HF gpt2 configs: n_ctx 1024, vocab 50257, LayerNorm, biases, tied wte.
    return {
        "transformer": {
            "num_layers": num_layers,
            "hidden_size": hidden,
            "num_heads": heads,
            "ffn_hidden_size": 4 * hidden,
            "vocab_size": 50257,
            "max_position_embeddings": 1024,
        }
    }


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int) -> dict[str, Any]:
    # RMSNorm, SwiGLU, no biases, RoPE, untied output projection (Touvron et al. 2023; Llama 3, 2024).
    return {
        "transformer": {
            "num_layers": layers,
            "hidden_size": hidden,
            "num_heads": heads,
            "num_kv_heads": kv,
            "ffn_hidden_size": ffn,
            "vocab_size": vocab,
            "gated_mlp": True,
            "norm": "rmsnorm",
            "bias": False,
            "tied_embeddings": False,
            "position_embedding": "rope",
        }
    }


def bert_large() -> dict[str, Any]:
    # Devlin et al. 2019: L=24, H=1024, A=16, 512 positions, 2 token types, WordPiece vocab 30522.
    return {
        "transformer": {
            "num_layers": 24,
            "hidden_size": 1024,
            "num_heads": 16,
            "ffn_hidden_size": 4096,
            "vocab_size": 30522,
            "max_position_embeddings": 512,
            "num_token_types": 2,
            "final_norm": False,
        }
    }


def gpt3_175b() -> dict[str, Any]:
    # Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048.
    return {
        "transformer": {
            "num_layers": 96,
            "hidden_size": 12288,
            "num_heads": 96,
            "ffn_hidden_size": 4 * 12288,
            "vocab_size": 50257,
            "max_position_embeddings": 2048,
        }
    }


def resnet50() -> dict[str, Any]:
    """torchvision resnet50 parameters in definition order, one layer per conv+BN (or fc), at 224x224.

    Forward FLOP = 2 x MACs of the conv/fc (4.09 GMAC per image in total, matching torchvision's
    reported 4.09 GFLOPS-as-MACs); activations saved per layer = conv output + BN output (ReLU in place).

    Each convolution runs as cuDNN's implicit GEMM (Chetlur et al. 2014, "cuDNN"): rows = output pixels,
    columns = output channels, depth = input channels x kernel area. Its batch norm and ReLU are
    memory-bound passes over the conv output (E elements): training-mode batch norm reads E for the
    statistics and reads and writes E to normalise, ReLU reads and writes E (5E forward); backward, ReLU's
    reads y and dy and writes dx, batch norm's reduction pass reads x and dy and its second pass reads x and
    dy and writes dx (8E). A downsample branch has no ReLU (3E and 5E).
    """
    params: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []

    def conv_bn(prefix: str, conv: str, bn: str, cin: int, cout: int, k: int, hw_out: int) -> None:
        first = len(params)
        params.append({"name": f"{prefix}{conv}.weight", "numel": cout * cin * k * k})
        params.append({"name": f"{prefix}{bn}.weight", "numel": cout})
        params.append({"name": f"{prefix}{bn}.bias", "numel": cout})
        out = cout * hw_out * hw_out
        relu = not conv.startswith("downsample")
        layers.append(
            {
                "name": f"{prefix}{conv}",
                "param_indices": [first, first + 1, first + 2],
                "fwd_flop_per_sample": 2.0 * cout * cin * k * k * hw_out * hw_out,
                "activation_numel_per_sample": 2 * out,
                "gemm_shape": [hw_out * hw_out, cout, cin * k * k],
                "elementwise_numel_per_sample": [5 * out, 8 * out] if relu else [3 * out, 5 * out],
            }
        )

    conv_bn("", "conv1", "bn1", 3, 64, 7, 112)
    inplanes, hw = 64, 56
    for li, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        for b in range(blocks):
            stride = 2 if (b == 0 and li > 1) else 1
            hw_out = hw // stride
            p = f"layer{li}.{b}."
            conv_bn(p, "conv1", "bn1", inplanes, planes, 1, hw)
            conv_bn(p, "conv2", "bn2", planes, planes, 3, hw_out)
            conv_bn(p, "conv3", "bn3", planes, planes * 4, 1, hw_out)
            if b == 0:
                conv_bn(p, "downsample.0", "downsample.1", inplanes, planes * 4, 1, hw_out)
            inplanes, hw = planes * 4, hw_out
    first = len(params)
    params.append({"name": "fc.weight", "numel": 1000 * 2048})
    params.append({"name": "fc.bias", "numel": 1000})
    layers.append(
        {
            "name": "fc",
            "param_indices": [first, first + 1],
            "fwd_flop_per_sample": 2.0 * 1000 * 2048,
            "activation_numel_per_sample": 2048,
            "gemm_shape": [1, 1000, 2048],
        }
    )
    return {"parameters": params, "layers": layers}


MODEL_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("gpt2", "GPT-2 small, 124M", "Radford et al. 2019; HF gpt2 config", lambda: _gpt2(12, 768, 12)),
        Preset("gpt2-medium", "GPT-2 medium, 355M", "Radford et al. 2019", lambda: _gpt2(24, 1024, 16)),
        Preset("gpt2-large", "GPT-2 large, 774M", "Radford et al. 2019", lambda: _gpt2(36, 1280, 20)),
        Preset("gpt2-xl", "GPT-2 XL, 1.5B", "Radford et al. 2019", lambda: _gpt2(48, 1600, 25)),
        Preset("bert-large", "BERT-large, 334M (encoder + embeddings, no pooler/MLM head)", "Devlin et al. 2019",
               bert_large),
        Preset("llama2-7b", "Llama 2 7B", "Touvron et al. 2023, Table 1; HF config",
               lambda: _llama(32, 4096, 32, 32, 11008, 32000)),
        Preset("llama2-13b", "Llama 2 13B", "Touvron et al. 2023, Table 1; HF config",
               lambda: _llama(40, 5120, 40, 40, 13824, 32000)),
        Preset("llama2-70b", "Llama 2 70B (GQA, 8 KV heads)", "Touvron et al. 2023; HF config",
               lambda: _llama(80, 8192, 64, 8, 28672, 32000)),
        Preset("llama3-8b", "Llama 3 8B (GQA, 128K vocab)", "Dubey et al. 2024, Table 3; HF config",
               lambda: _llama(32, 4096, 32, 8, 14336, 128256)),
        Preset("llama3-70b", "Llama 3 70B (GQA, 128K vocab)", "Dubey et al. 2024, Table 3; HF config",
               lambda: _llama(80, 8192, 64, 8, 28672, 128256)),
        Preset("llama3-405b", "Llama 3 405B (GQA, 128K vocab)", "Dubey et al. 2024, Table 3; HF config",
               lambda: _llama(126, 16384, 128, 8, 53248, 128256)),
        Preset("gpt3-175b", "GPT-3 175B", "Brown et al. 2020, Table 2.1", gpt3_175b),
        Preset("resnet50", "ResNet-50 at 224x224, per-layer parameters and FLOP", "He et al. 2016; torchvision",
               resnet50),
    )
}
