// edgerun's browser runtime: replays the decode and prefill plans `edgerun web export` wrote, with the
// browser's WebGPU.
//
// A plan is the webgpu backend's captured dispatch list for one step: WGSL shaders, and for each dispatch its
// shader, the ranges it binds in two buffers (the plan's arena "a": inputs, intermediates, outputs and the
// KV cache; the weights "w", shared by both plans; small parameter tables "pN"; the status word "s") and its
// workgroup counts. Pipelines and bind groups are made once (the capture); a step writes its inputs (the
// token ids, the position, the last real row), re-records the same dispatches (command buffers are
// single-use), and reads back the 4-byte token the GPU argmax chose. A prompt runs through the prefill plan
// a chunk of tokens at a time; its cache is then copied into the decode plan's arena. No framework, no
// build step.

const STORAGE = GPUBufferUsage.STORAGE;
const USAGE = STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

// One captured step: its arena, parameter tables, pipelines and bind groups.
class Replay {
  constructor(device, plan, shared) {
    this.device = device;
    this.plan = plan;
    this.buffers = {...shared, a: device.createBuffer({size: plan.arena_bytes, usage: USAGE})};
    plan.params.forEach((table, i) => {
      const buf = device.createBuffer({size: 4 * table.length, usage: USAGE});
      device.queue.writeBuffer(buf, 0, Int32Array.from(table));
      this.buffers[`p${i}`] = buf;
    });
    this.readback = device.createBuffer({size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  }

  async build() {
    const device = this.device;
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
  }

  // One step: `tokens` (an Int32Array of the plan's length) from `position`, the argmax of row `last`.
  async run(tokens, position, last) {
    const {device, plan} = this;
    const q = device.queue;
    q.writeBuffer(this.buffers.a, plan.inputs.tokens, tokens);
    q.writeBuffer(this.buffers.a, plan.inputs.start, Int32Array.of(position));
    q.writeBuffer(this.buffers.a, plan.inputs.last, Int32Array.of(last));
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
    const shared = {
      w: device.createBuffer({size: Math.max(plan.weights_bytes, 4), usage: USAGE}),
      s: device.createBuffer({size: 4, usage: USAGE}),
    };
    device.queue.writeBuffer(shared.w, 0, weights);
    this.decode = new Replay(device, plan, shared);
    this.prefill = plan.prefill ? new Replay(device, plan.prefill, shared) : null;
    this.replays = {decode: 0, prefill: 0};  // steps run by each plan, for the page's stats and the tests
  }

  async build() {
    this.device.pushErrorScope("validation");
    await this.decode.build();
    if (this.prefill) await this.prefill.build();
    const error = await this.device.popErrorScope();
    if (error) throw new Error(`WebGPU refused the plan: ${error.message}`);
  }

  // One decode step: `token` at `position`; returns the greedy next token.
  step(token, position) {
    this.replays.decode++;
    return this.decode.run(Int32Array.of(token), position, 0);
  }

  // The prompt `ids` from position 0, a chunk per prefill replay (the last padded), as edgerun.llm's
  // StepRunner runs it: a chunk that would pass the end of the context starts earlier, at context - chunk,
  // and runs again the tokens it then covers (update_slice would clamp it). The cache is then copied into
  // the decode arena. Returns the greedy token after the prompt.
  async runPrompt(ids, context) {
    const chunk = this.plan.prefill.chunk;
    let held = [];
    let next = 0;
    for (let begin = 0; begin < ids.length; begin += chunk) {
      const start = Math.min(held.length, context - chunk);
      const run = held.slice(start).concat(ids.slice(begin, begin + chunk));
      held = held.slice(0, start).concat(run);
      const tokens = new Int32Array(chunk);
      tokens.set(run);
      next = await this.prefill.run(tokens, start, run.length - 1);
      this.replays.prefill++;
    }
    const enc = this.device.createCommandEncoder();
    for (const [, from, to, size] of this.plan.prefill.caches) {
      enc.copyBufferToBuffer(this.prefill.buffers.a, from, this.decode.buffers.a, to, size);
    }
    this.device.queue.submit([enc.finish()]);
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

  // Greedy continuation of `ids`: the prompt runs through the prefill plan a chunk at a time (filling the
  // cache; a one-token prompt, or a bundle without a prefill plan, through the decode step token by token),
  // then each decode step's argmax is fed back. Stops at a stop id (unless ignoreStop) or maxNew tokens.
  async generate(ids, maxNew, {onToken = null, ignoreStop = false} = {}) {
    if (!ids.length) throw new Error("the prompt is empty");
    if (ids.length + maxNew > this.model.context) {
      throw new Error(`${ids.length} prompt tokens + ${maxNew} new exceed the context of ${this.model.context}`);
    }
    const stops = new Set(ignoreStop ? [] : this.model.stop_ids);
    const started = performance.now();
    const before = {...this.decoder.replays};
    let next = 0;
    if (this.decoder.prefill && ids.length > 1) next = await this.decoder.runPrompt(ids, this.model.context);
    else for (let p = 0; p < ids.length; p++) next = await this.decoder.step(ids[p], p);
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
    const replays = {decode: this.decoder.replays.decode - before.decode,
                     prefill: this.decoder.replays.prefill - before.prefill};
    return {ids: out, text: this.tokenizer.decode(out), prefillMs, decodeMs, replays};
  }

  chatPrompt(message) {
    const chat = this.model.chat;
    return chat ? chat.before + message + chat.after : message;
  }
}
