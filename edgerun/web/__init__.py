"""The browser runtime: an LLM's decode step as a static bundle that a small JavaScript runtime replays with the
browser's WebGPU (`edgerun web export MODEL -o DIR`), and a chat page served from it (`edgerun web serve DIR`).

    decode_plan.py   the decode program loaded on webgpu, its dispatch list written down as a plan
    bundle.py        the bundle folder: plan, weights, tokenizer, chat template pieces, the static files
    server.py        a static file server for the bundle (the chat page at /)
    runtime.js       plan replay with WebGPU, the BPE tokenizer, greedy generation (copied into bundles)
    index.html       the chat page (copied into bundles)
"""
