"""Model tooling on the host: model references and built-in models, ONNX -> MNN conversion, variants
(fp16, int8, MNN) and the graph tooling for quantization."""
