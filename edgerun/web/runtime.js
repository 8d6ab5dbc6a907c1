// edgerun's browser runtime: replays the decode plan `edgerun web export` wrote, with the browser's WebGPU.
//
// The plan is the webgpu backend's captured dispatch list for one decode step: WGSL shaders, and for each
// dispatch its shader, the ranges it binds in two buffers (the arena "a": inputs, intermediates, outputs and
// the KV cache; the weights "w"; small parameter tables "pN"; the status word "s") and its workgroup counts.
// Pipelines and bind groups are made once (the capture); a step writes three int32s (token, position, last
// row), re-records the same dispatches (command buffers are single-use), and reads back the 4-byte token the
// GPU argmax chose. No framework, no build step.

const STORAGE = GPUBufferUsage.STORAGE;

export class DecodePlan {
  static async load(base = ".") {
    if (!navigator.gpu) throw new Error("this browser has no WebGPU (navigator.gpu is missing)");
    const [plan, weights] = await Promise.all([
      fetchOk(`${base}/plan.json`).then((r) => r.json()),
      fetchOk(`${base}/weights.bin`).then((r) => r.arrayBuffer()),
    ]);
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) throw new Error("no WebGPU adapter");
    const lim = adapter.limits;
    if (plan.max_bindings > lim.maxStorageBuffersPerShaderStage) {
      throw new Error(`the plan binds ${plan.max_bindings} storage buffers in one dispatch; this adapter ` +
                      `allows ${lim.maxStorageBuffersPerShaderStage}`);
    }
    if (plan.max_binding_bytes > lim.maxStorageBufferBindingSize) {
      throw new Error(`the plan binds ${plan.max_binding_bytes} bytes at once; this adapter allows ` +
                      `${lim.maxStorageBufferBindingSize}`);
    }
    const device = await adapter.requestDevice({requiredLimits: {
      maxStorageBuffersPerShaderStage: lim.maxStorageBuffersPerShaderStage,
      maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
      maxBufferSize: lim.maxBufferSize,
    }});
    device.lost.then((info) => console.error(`WebGPU device lost: ${info.message}`));
    const decoder = new DecodePlan(device, plan, weights, adapter);
    await decoder.build();
    return decoder;
  }

  constructor(device, plan, weights, adapter) {
    this.device = device;
    this.plan = plan;
    this.adapterInfo = adapter.info || {};
    const usage = STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    this.buffers = {
      a: device.createBuffer({size: plan.arena_bytes, usage}),
      w: device.createBuffer({size: Math.max(plan.weights_bytes, 4), usage}),
      s: device.createBuffer({size: 4, usage}),
    };
    device.queue.writeBuffer(this.buffers.w, 0, weights);
    plan.params.forEach((table, i) => {
      const buf = device.createBuffer({size: 4 * table.length, usage});
      device.queue.writeBuffer(buf, 0, Int32Array.from(table));
      this.buffers[`p${i}`] = buf;
    });
    this.readback = device.createBuffer({size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  }

  async build() {
    const device = this.device;
    device.pushErrorScope("validation");
    const modules = this.plan.shaders.map((code) => device.createShaderModule({code}));
    for (const [i, module] of modules.entries()) {
      const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
      if (errors.length) {
        const where = this.plan.dispatches.find((d) => d.shader === i)?.label;
        throw new Error(`shader ${i} (${where}) does not compile: ` +
                        errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join("; "));
      }
    }
    const pipelines = await Promise.all(modules.map((module) => device.createComputePipelineAsync({
      layout: "auto", compute: {module, entryPoint: "main"},
    })));
    this.dispatches = this.plan.dispatches.map((d) => {
      const pipeline = pipelines[d.shader];
      const entries = d.bind.map(([buf, offset, size], binding) => (
        {binding, resource: {buffer: this.buffers[buf], offset, size}}));
      const group = device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries});
      return [pipeline, group, d.groups[0], d.groups[1]];
    });
    const error = await device.popErrorScope();
    if (error) throw new Error(`WebGPU refused the plan: ${error.message}`);
  }

  // One decode step: `token` at `position`; returns the greedy next token.
  async step(token, position) {
    const {device, plan} = this;
    const q = device.queue;
    q.writeBuffer(this.buffers.a, plan.inputs.tokens, Int32Array.of(token));
    q.writeBuffer(this.buffers.a, plan.inputs.start, Int32Array.of(position));
    q.writeBuffer(this.buffers.a, plan.inputs.last, Int32Array.of(0));
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    for (const [pipeline, group, x, y] of this.dispatches) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, y);
    }
    pass.end();
    enc.copyBufferToBuffer(this.buffers.a, plan.next_token, this.readback, 0, 4);
    q.submit([enc.finish()]);
    await this.readback.mapAsync(GPUMapMode.READ);
    const next = new Int32Array(this.readback.getMappedRange())[0];
    this.readback.unmap();
    return next;
  }
}

async function fetchOk(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r;
}

// ---- the tokenizer: byte-level BPE, as edgerun/llm/tokenizer.py (GPT-2's split pattern) ----------------

const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function byteToUnicode() {
  const keep = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const chars = keep.slice();
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    if (!keep.includes(b)) { keep.push(b); chars.push(256 + extra); extra++; }
  }
  const map = new Array(256);
  keep.forEach((b, i) => { map[b] = String.fromCodePoint(chars[i]); });
  return map;
}

export class Tokenizer {
  constructor(spec) {
    this.tokens = spec.tokens;
    this.vocab = new Map(spec.tokens.map((t, i) => [t, i]));
    this.ranks = new Map(spec.merges.map((m, i) => [m, i]));
    this.specialIds = new Set(spec.special_ids);
    this.special = new Map(spec.special_ids.map((i) => [spec.tokens[i], i]));
    const alternatives = [...this.special.keys()].sort((a, b) => b.length - a.length)
      .map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    this.specialSplit = alternatives.length ? new RegExp(`(${alternatives.join("|")})`) : null;
    this.byteMap = byteToUnicode();
    this.charToByte = new Map(this.byteMap.map((c, b) => [c, b]));
    this.bos = spec.bos_id;
    this.addBos = spec.add_bos;
    this.cache = new Map();
    this.utf8 = new TextEncoder();
  }

  encode(text) {
    const ids = this.addBos && this.bos != null ? [this.bos] : [];
    const parts = this.specialSplit ? text.split(this.specialSplit) : [text];
    parts.forEach((part, k) => {
      if (k % 2) ids.push(this.special.get(part));
      else if (part) for (const piece of part.match(GPT2_SPLIT) || []) ids.push(...this.encodePiece(piece));
    });
    return ids;
  }

  encodePiece(piece) {
    const hit = this.cache.get(piece);
    if (hit) return hit;
    let word = Array.from(this.utf8.encode(piece), (b) => this.byteMap[b]);
    while (word.length > 1) {
      let best = -1, bestRank = Infinity;
      for (let i = 0; i < word.length - 1; i++) {
        const rank = this.ranks.get(`${word[i]} ${word[i + 1]}`);
        if (rank !== undefined && rank < bestRank) { best = i; bestRank = rank; }
      }
      if (best < 0) break;
      const [a, b] = [word[best], word[best + 1]];
      const merged = [];
      for (let i = 0; i < word.length; i++) {  // every occurrence of the best pair, left to right
        if (i < word.length - 1 && word[i] === a && word[i + 1] === b) { merged.push(a + b); i++; }
        else merged.push(word[i]);
      }
      word = merged;
    }
    const ids = word.map((w) => {
      const id = this.vocab.get(w);
      if (id === undefined) throw new Error(`token ${w} is not in the vocabulary`);
      return id;
    });
    this.cache.set(piece, ids);
    return ids;
  }

  decode(ids) {
    const bytes = [];
    for (const id of ids) {
      const text = this.tokens[id];
      if (this.specialIds.has(id)) { bytes.push(...this.utf8.encode(text)); continue; }
      for (const ch of text) {
        const b = this.charToByte.get(ch);
        if (b !== undefined) bytes.push(b); else bytes.push(...this.utf8.encode(ch));
      }
    }
    return new TextDecoder("utf-8").decode(Uint8Array.from(bytes));
  }
}

// ---- generation ----------------------------------------------------------------------------------------

export class ChatModel {
  static async load(base = ".") {
    const [decoder, model] = await Promise.all([
      DecodePlan.load(base), fetchOk(`${base}/model.json`).then((r) => r.json())]);
    return new ChatModel(decoder, model);
  }

  constructor(decoder, model) {
    this.decoder = decoder;
    this.model = model;
    this.tokenizer = new Tokenizer(model.tokenizer);
  }

  // Greedy continuation of `ids`: the prompt runs through the decode step token by token (filling the
  // cache), then each step's argmax is fed back. Stops at a stop id (unless ignoreStop) or maxNew tokens.
  async generate(ids, maxNew, {onToken = null, ignoreStop = false} = {}) {
    if (!ids.length) throw new Error("the prompt is empty");
    if (ids.length + maxNew > this.model.context) {
      throw new Error(`${ids.length} prompt tokens + ${maxNew} new exceed the context of ${this.model.context}`);
    }
    const stops = new Set(ignoreStop ? [] : this.model.stop_ids);
    const started = performance.now();
    let next = 0;
    for (let p = 0; p < ids.length; p++) next = await this.decoder.step(ids[p], p);
    const prefillMs = performance.now() - started;
    const out = [];
    for (let p = ids.length; out.length < maxNew; p++) {
      if (stops.has(next)) break;
      out.push(next);
      if (onToken) onToken(next, out);
      if (out.length === maxNew) break;
      next = await this.decoder.step(next, p);
    }
    const decodeMs = performance.now() - started - prefillMs;
    return {ids: out, text: this.tokenizer.decode(out), prefillMs, decodeMs};
  }

  chatPrompt(message) {
    const chat = this.model.chat;
    return chat ? chat.before + message + chat.after : message;
  }
}
