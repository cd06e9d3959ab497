"""Every way of running a model behind one interface (``harness.runtimes.base.Runtime``): eager,
exported, the .pte through ExecuTorch's Python runtime, TextLLMRunner, the native runner, llama.cpp;
and the process transport that runs any of them in a process of its own."""
