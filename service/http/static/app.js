"use strict";
// The page of GET /ui: it calls the public API like any client (the API key typed into it, when one
// is set). Static (no inline script or style), so that it runs under a strict Content-Security-Policy.

// What a test (or a curious person) can read: set as things happen.
const ui = window.vaeserveUi = { latents: null, model: null, requestId: null, status: null, responseEnded: false,
  firstBytesAt: null, startedAt: null, endedAt: null, framesReceived: 0, framesTotal: null, download: null,
  errors: [] };
window.addEventListener("error", e => ui.errors.push(String(e.message)));
window.addEventListener("unhandledrejection", e => ui.errors.push(String(e.reason)));
const $ = id => document.getElementById(id);

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}
function headers() {
  const key = $("key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}
const seconds = since => ((performance.now() - since) / 1000).toFixed(2);
const megabytes = bytes => (bytes / 1e6).toFixed(bytes < 1e5 ? 3 : 1);

// ---- latents files: read the shape (and, for .pt, the raw bytes) -----------------------------
const DTYPES = { "<f4": "float32", "<f2": "float16", F32: "float32", F16: "float16", BF16: "bfloat16" };

function readNpy(bytes) {
  if (String.fromCharCode(...bytes.slice(1, 6)) !== "NUMPY") throw new Error("not a .npy file");
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  const [length, start] = bytes[6] === 1 ? [view.getUint16(8, true), 10] : [view.getUint32(8, true), 12];
  const header = new TextDecoder().decode(bytes.slice(start, start + length));
  const shape = header.match(/'shape':\s*\(([^)]*)\)/)[1].split(",").filter(s => s.trim()).map(Number);
  const descr = header.match(/'descr':\s*'([^']*)'/)[1];
  return { shape, dtype: DTYPES[descr] || descr, body: bytes, contentType: "application/x-npy" };
}

function readSafetensors(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  const length = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.slice(8, 8 + length)));
  const names = Object.keys(header).filter(k => k !== "__metadata__");
  if (names.length !== 1) throw new Error(`a safetensors file with one tensor is expected; this one has ${names.length}`);
  const tensor = header[names[0]];
  return { shape: tensor.shape, dtype: DTYPES[tensor.dtype] || tensor.dtype, body: bytes, contentType: "application/x-safetensors" };
}

// A torch.save'd tensor: a zip (stored, not compressed) of data.pkl and the storages. The pickle
// is read by a small interpreter that knows what torch writes for one tensor (no code runs), and
// the tensor goes to the server as raw bytes with its shape and dtype.
function zipEntries(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset);
  let end = bytes.length - 22;
  while (end >= 0 && view.getUint32(end, true) !== 0x06054b50) end--;
  if (end < 0) throw new Error("not a .pt file (no zip directory)");
  const count = view.getUint16(end + 10, true);
  let at = view.getUint32(end + 16, true);
  const entries = {};
  for (let i = 0; i < count; i++) {
    const method = view.getUint16(at + 10, true), size = view.getUint32(at + 20, true);
    const nameLength = view.getUint16(at + 28, true), extra = view.getUint16(at + 30, true);
    const comment = view.getUint16(at + 32, true), local = view.getUint32(at + 42, true);
    const name = new TextDecoder().decode(bytes.slice(at + 46, at + 46 + nameLength));
    const data = local + 30 + view.getUint16(local + 26, true) + view.getUint16(local + 28, true);
    if (method !== 0) throw new Error(`${name} is compressed; torch.save stores its entries`);
    entries[name.slice(name.indexOf("/") + 1)] = bytes.subarray(data, data + size);
    at += 46 + nameLength + extra + comment;
  }
  return entries;
}

function unpickle(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const text = (at, n) => new TextDecoder().decode(bytes.subarray(at, at + n));
  const stack = [], memo = [], marks = [];
  const popMark = () => stack.splice(marks.pop());
  const call = (fn, args) => {
    if (fn === "torch._utils._rebuild_tensor_v2") return { storage: args[0], offset: args[1], shape: args[2], stride: args[3] };
    if (fn === "collections.OrderedDict") return {};
    throw new Error(`the pickle calls ${fn}: not a plain tensor`);
  };
  for (let at = 0; ;) {
    const op = bytes[at++];
    switch (op) {
      case 0x80: at++; break;                                   // PROTO
      case 0x95: at += 8; break;                                // FRAME
      case 0x63: { const end = bytes.indexOf(10, at), end2 = bytes.indexOf(10, end + 1);  // GLOBAL
        stack.push(`${text(at, end - at)}.${text(end + 1, end2 - end - 1)}`); at = end2 + 1; break; }
      case 0x93: { const name = stack.pop(); stack.push(`${stack.pop()}.${name}`); break; }  // STACK_GLOBAL
      case 0x71: memo[bytes[at++]] = stack.at(-1); break;       // BINPUT
      case 0x72: memo[view.getUint32(at, true)] = stack.at(-1); at += 4; break;  // LONG_BINPUT
      case 0x94: memo.push(stack.at(-1)); break;                // MEMOIZE
      case 0x68: stack.push(memo[bytes[at++]]); break;          // BINGET
      case 0x6a: stack.push(memo[view.getUint32(at, true)]); at += 4; break;  // LONG_BINGET
      case 0x28: marks.push(stack.length); break;               // MARK
      case 0x74: stack.push(popMark()); break;                  // TUPLE
      case 0x29: stack.push([]); break;                         // EMPTY_TUPLE
      case 0x85: stack.push(stack.splice(-1)); break;           // TUPLE1
      case 0x86: stack.push(stack.splice(-2)); break;           // TUPLE2
      case 0x87: stack.push(stack.splice(-3)); break;           // TUPLE3
      case 0x4b: stack.push(bytes[at++]); break;                // BININT1
      case 0x4d: stack.push(view.getUint16(at, true)); at += 2; break;  // BININT2
      case 0x4a: stack.push(view.getInt32(at, true)); at += 4; break;   // BININT
      case 0x8a: { const n = bytes[at++]; let value = 0;                // LONG1
        for (let i = n - 1; i >= 0; i--) value = value * 256 + bytes[at + i]; stack.push(value); at += n; break; }
      case 0x58: { const n = view.getUint32(at, true); stack.push(text(at + 4, n)); at += 4 + n; break; }  // BINUNICODE
      case 0x8c: { const n = bytes[at++]; stack.push(text(at, n)); at += n; break; }  // SHORT_BINUNICODE
      case 0x51: { const pid = stack.pop(); stack.push({ type: pid[1], key: pid[2] }); break; }  // BINPERSID
      case 0x52: { const args = stack.pop(); stack.push(call(stack.pop(), args)); break; }  // REDUCE
      case 0x7d: case 0x5d: stack.push(op === 0x7d ? {} : []); break;  // EMPTY_DICT, EMPTY_LIST
      case 0x73: stack.splice(-2); break;                       // SETITEM (the dicts are not needed)
      case 0x75: case 0x65: popMark(); break;                   // SETITEMS, APPENDS
      case 0x61: stack.pop(); break;                            // APPEND
      case 0x88: case 0x89: stack.push(op === 0x88); break;     // NEWTRUE, NEWFALSE
      case 0x4e: stack.push(null); break;                       // NONE
      case 0x62: stack.pop(); break;                            // BUILD (state of an OrderedDict)
      case 0x2e: return stack.pop();                            // STOP
      default: throw new Error(`unexpected pickle opcode 0x${op.toString(16)}: not a plain tensor`);
    }
  }
}

function readPt(bytes) {
  const entries = zipEntries(bytes);
  const tensor = unpickle(entries["data.pkl"]);
  if (!tensor || !tensor.storage) throw new Error("the .pt file does not hold one tensor");
  const dtype = { "torch.FloatStorage": "float32", "torch.HalfStorage": "float16",
                  "torch.BFloat16Storage": "bfloat16" }[tensor.storage.type];
  if (!dtype) throw new Error(`tensor storage ${tensor.storage.type}: float32, float16 or bfloat16 expected`);
  const itemsize = dtype === "float32" ? 4 : 2, count = tensor.shape.reduce((a, b) => a * b, 1);
  let expected = 1;  // C order: the stride of each axis is the product of the later sizes
  for (let axis = tensor.shape.length - 1; axis >= 0; axis--) {
    if (tensor.shape[axis] > 1 && tensor.stride[axis] !== expected) throw new Error("the tensor is not contiguous: save t.contiguous()");
    expected *= tensor.shape[axis];
  }
  const storage = entries[`data/${tensor.storage.key}`];
  const body = storage.subarray(tensor.offset * itemsize, (tensor.offset + count) * itemsize);
  return { shape: tensor.shape, dtype, body, contentType: "application/octet-stream", raw: true };
}

async function readLatents(file) {
  const bytes = new Uint8Array(await file.arrayBuffer());
  const name = file.name.toLowerCase();
  if (name.endsWith(".npy")) return readNpy(bytes);
  if (name.endsWith(".safetensors")) return readSafetensors(bytes);
  if (name.endsWith(".pt") || name.endsWith(".pth")) return readPt(bytes);
  throw new Error(`${file.name}: .npy, .safetensors or .pt expected`);
}

async function useFile(file) {
  try {
    ui.latents = await readLatents(file);
    ui.latents.name = file.name;
    $("latents").textContent = `${file.name}: ${ui.latents.dtype} (${ui.latents.shape.join(", ")})`;
    $("decode").disabled = false;
    drawMesh();
  } catch (error) {
    ui.latents = null;
    $("decode").disabled = true;
    say(String(error.message || error), true);
  }
}
$("file").addEventListener("change", () => $("file").files[0] && useFile($("file").files[0]));
$("drop").addEventListener("dragover", e => { e.preventDefault(); $("drop").classList.add("over"); });
$("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
$("drop").addEventListener("drop", e => {
  e.preventDefault(); $("drop").classList.remove("over");
  if (e.dataTransfer.files[0]) useFile(e.dataTransfer.files[0]);
});

// ---- this request's progress and its download ---------------------------------------------------
// Frames a decode of these latents yields: 1 + temporal_scale (T - 1) per video (GET /v1/models).
function framesOf(shape) {
  if (!ui.model) return null;
  const [t] = shape.slice(-3, -2), videos = shape.length === 5 ? shape[0] : 1;
  return videos * (1 + ui.model.latents.temporal_scale * (t - 1));
}

function showProgress(frames, what) {
  ui.framesReceived = frames;
  const bar = $("progress"), total = ui.framesTotal;
  bar.hidden = false;
  if (total) { bar.max = total; bar.value = frames; } else bar.removeAttribute("value");
  $("frames").textContent = `${what}: ${frames}${total ? ` of ${total}` : ""} frames`;
}

function offerDownload(blob, name) {
  const link = $("download");
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(blob);
  link.download = name;
  link.textContent = `Download ${name} (${megabytes(blob.size)} MB)`;
  link.hidden = false;
  ui.download = { name, bytes: blob.size };
}

// uint8 frames (F, H, W, 3) as a .npy file (version 1.0, header padded to 64 bytes).
function npyBlob(frames, shape) {
  let header = `{'descr': '|u1', 'fortran_order': False, 'shape': (${shape.join(", ")}), }`;
  header += " ".repeat(63 - ((10 + header.length) % 64)) + "\n";
  const head = new Uint8Array(10 + header.length);
  head.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0, header.length & 255, header.length >> 8]);
  head.set(new TextEncoder().encode(header), 10);
  return new Blob([head, ...frames], { type: "application/octet-stream" });
}

// ---- decoding ---------------------------------------------------------------------------------
async function problemText(response) {
  try { const p = await response.json(); return `${p.status} ${p.title}: ${p.detail}`; }
  catch { return `${response.status} ${response.statusText}`; }
}

$("decode").addEventListener("click", async () => {
  const latents = ui.latents, mode = $("output").value;
  Object.assign(ui, { responseEnded: false, firstBytesAt: null, endedAt: null, startedAt: performance.now(),
                      status: null, requestId: null, framesReceived: 0, framesTotal: framesOf(latents.shape),
                      download: null });
  const query = new URLSearchParams({ fps: $("fps").value, denormalize: $("denormalize").checked });
  if (mode !== "frames") query.set("output_type", "mp4");
  if (mode !== "mp4") query.set("stream", "true");
  if (latents.raw) { query.set("shape", latents.shape.join(",")); query.set("dtype", latents.dtype); }
  $("decode").disabled = true;
  $("download").hidden = true;
  $("frames").textContent = "";
  $("progress").hidden = true;
  say(`sending ${latents.name} (${megabytes(latents.body.length)} MB)…`);
  try {
    const response = await fetch(`/v1/decode?${query}`, { method: "POST", body: latents.body,
      headers: { "Content-Type": latents.contentType, ...headers() } });
    ui.status = response.status;
    ui.requestId = response.headers.get("X-Request-Id");
    if (!response.ok) { say(await problemText(response), true); return; }
    say(`request ${ui.requestId}: decoding…`);
    if (mode === "mp4-stream") await playFragments(response);
    else if (mode === "mp4") await playWhole(response);
    else await drawFrames(response);
    ui.endedAt = performance.now();
    const first = ui.firstBytesAt === null ? "" : `first frame after ${((ui.firstBytesAt - ui.startedAt) / 1000).toFixed(2)} s, `;
    say(`request ${ui.requestId}: ${first}all ${ui.framesReceived} frames after ${seconds(ui.startedAt)} s`);
  } catch (error) {
    say(`request ${ui.requestId || "?"}: ${error.message || error} (an answer cut off: the server log names the problem)`, true);
  } finally {
    ui.responseEnded = true;
    $("decode").disabled = false;
  }
});

function once(target, event) { return new Promise(resolve => target.addEventListener(event, resolve, { once: true })); }

// MP4 codec string from the init segment's avcC box: avc1.PPCCLL (profile, constraints, level).
function codecOf(bytes) {
  for (let i = 4; i + 8 < bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) {
      const hex = b => b.toString(16).padStart(2, "0");
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`;
    }
  }
  return null;
}

// The top-level boxes of a growing MP4, read as its bytes arrive: one `mdat` per frame (the server
// writes a fragment per frame), counted once it has arrived whole.
class BoxCounter {
  constructor() { this.data = new Uint8Array(0); this.at = 0; this.frames = 0; }
  push(chunk) {
    const joined = new Uint8Array(this.data.length + chunk.length);
    joined.set(this.data); joined.set(chunk, this.data.length); this.data = joined;
    const view = new DataView(this.data.buffer);
    while (this.at + 8 <= this.data.length) {
      const size = view.getUint32(this.at);
      if (size < 8 || this.at + size > this.data.length) break;
      if (String.fromCharCode(...this.data.subarray(this.at + 4, this.at + 8)) === "mdat") this.frames++;
      this.at += size;
    }
  }
}

function show(element) {
  $("video").hidden = element !== "video";
  $("canvas").hidden = element !== "canvas";
}

async function playFragments(response) {
  const video = $("video"), source = new MediaSource(), boxes = new BoxCounter(), chunks = [];
  show("video");
  video.src = URL.createObjectURL(source);
  await once(source, "sourceopen");
  const reader = response.body.getReader();
  let buffer = null, head = new Uint8Array(0);
  const append = async data => {
    buffer.appendBuffer(data);
    await once(buffer, "updateend");
  };
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    boxes.push(value);
    if (buffer === null) {  // wait for the init segment (ftyp + moov) to learn the codec
      const joined = new Uint8Array(head.length + value.length);
      joined.set(head); joined.set(value, head.length); head = joined;
      const codec = codecOf(head);
      if (codec === null) continue;
      buffer = source.addSourceBuffer(`video/mp4; codecs="${codec}"`);
      await append(head);
    } else {
      await append(value);
    }
    showProgress(boxes.frames, "playing while it decodes");
    if (ui.firstBytesAt === null && buffer.buffered.length) {
      ui.firstBytesAt = performance.now();
      video.play().catch(() => {});
    }
  }
  if (buffer !== null && source.readyState === "open") source.endOfStream();
  showProgress(boxes.frames, "decoded");
  offerDownload(new Blob(chunks, { type: "video/mp4" }), "video.mp4");
}

async function playWhole(response) {
  showProgress(0, "decoding (the whole file comes at the end)");
  const blob = await response.blob();
  ui.firstBytesAt = performance.now();
  show("video");
  $("video").src = URL.createObjectURL(blob);
  $("video").play().catch(() => {});
  showProgress(ui.framesTotal || 0, "decoded");
  offerDownload(blob, "video.mp4");
}

// The raw frame stream (application/x-vaeserve-stream): u32 LE header length, JSON header, payload.
async function drawFrames(response) {
  const canvas = $("canvas"), context = canvas.getContext("2d"), reader = response.body.getReader();
  show("canvas");
  let data = new Uint8Array(0), shape = null;
  const frames = [], kept = [];
  const fps = Number($("fps").value) || 16;
  const timer = setInterval(() => {
    const frame = frames.shift();
    if (frame) context.putImageData(frame, 0, 0);
  }, 1000 / fps);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const joined = new Uint8Array(data.length + value.length);
      joined.set(data); joined.set(value, data.length); data = joined;
      for (;;) {
        if (data.length < 4) break;
        const length = new DataView(data.buffer).getUint32(0, true);
        if (data.length < 4 + length) break;
        const header = JSON.parse(new TextDecoder().decode(data.subarray(4, 4 + length)));
        if (data.length < 4 + length + header.nbytes) break;
        const payload = data.slice(4 + length, 4 + length + header.nbytes);
        data = data.slice(4 + length + header.nbytes);
        if (header.type === "error") throw new Error(`${header.problem.status} ${header.problem.title}: ${header.problem.detail}`);
        if (header.type !== "frames") continue;
        const [f, h, w] = header.shape.slice(-4, -1);
        canvas.width = w; canvas.height = h;
        for (let i = 0; i < f; i++) {
          const image = context.createImageData(w, h);
          for (let p = 0, q = i * h * w * 3; p < h * w; p++, q += 3) {
            image.data.set(payload.subarray(q, q + 3), p * 4); image.data[p * 4 + 3] = 255;
          }
          frames.push(image);
        }
        kept.push(payload);
        shape = [header.frame_start + f, h, w, 3];
        showProgress(shape[0], "drawn as they decode");
        if (ui.firstBytesAt === null) ui.firstBytesAt = performance.now();
      }
    }
    while (frames.length) await new Promise(resolve => setTimeout(resolve, 1000 / fps));
  } finally {
    clearInterval(timer);
  }
  if (shape) offerDownload(npyBlob(kept, shape), "frames.npy");
}

// ---- the service beside it: the model, the mesh and its bands, queue, compiled programs ------------
function metric(text, name) {
  const match = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
  return match ? Number(match[1]) : null;
}

// The band layout of sharding/bands.py: the axis that needs less padding (ties: height), split into
// tp bands of ceil(size / tp) latent rows (or columns), the last ones padded. Drawn for one frame of
// the latents loaded (or, before any, a 16:9 frame of 90x160 latents), one band per device of a
// replica; `mesh` is GET /v1/models' (dp, tp, devices).
function drawMesh(mesh = ui.model && ui.model.mesh, shape = ui.latents && ui.latents.shape) {
  if (!mesh) return;
  const { dp, tp, devices } = mesh, scale = ui.model ? ui.model.latents.spatial_scale : 8;
  const [height, width] = shape ? shape.slice(-2) : [90, 160];
  const band = size => Math.ceil(size / tp), pad = size => band(size) * tp - size;
  const split = pad(height) <= pad(width) ? "height" : "width", size = split === "height" ? height : width;
  const unit = split === "height" ? "rows" : "columns";
  const platform = devices.length ? devices[0].split(/[_:(\s]/)[0] : "";
  $("mesh").textContent = `dp = ${dp} × tp = ${tp} on ${devices.length} device${devices.length === 1 ? "" : "s"}` +
    (platform ? ` (${devices.join(", ")})` : "");
  const bands = $("bands");
  bands.replaceChildren();
  bands.className = `bands by-${split}`;
  bands.style.aspectRatio = `${width} / ${height}`;  // CSSOM, not an inline style: allowed by the page's CSP
  for (let rank = 0; rank < tp; rank++) {
    const rows = Math.max(0, Math.min(band(size), size - rank * band(size)));
    const cell = document.createElement("div");
    cell.style.background = `hsl(${210 + (rank * 360) / tp}, 35%, ${rank % 2 ? 38 : 46}%)`;
    const padded = rows < band(size) ? ` (${band(size) - rows} padding)` : "";
    cell.textContent = tp === 1 ? "device 0: the whole frame" : tp <= 4 ? `device ${rank}: ${rows} ${unit}${padded}`
      : `${rank}${padded}`;
    cell.title = `device ${rank}: latent ${unit} ${rank * band(size)}–${rank * band(size) + rows - 1} ` +
      `(${rows * scale} pixel ${unit})`;
    bands.appendChild(cell);
  }
  const frame = `${width}×${height} latents, ${width * scale}×${height * scale} pixels` +
    (shape ? "" : ": 720p, before any latents are loaded");
  $("mesh-note").textContent = tp === 1
    ? `One device decodes the whole frame (${frame}). With tp = N, N devices would each decode a band of ` +
      "every frame, exchanging one-row halos with their neighbours: each holds 1/N of the activations, and the " +
      "frames are the same."
    : `Each frame (${frame}) is split by ${split} into ${tp} bands of ${band(size)} latent ${unit} ` +
      `(${band(size) * scale} pixel ${unit}), one per device, each exchanging one-row halos with its neighbours` +
      (pad(size) ? `; the last ${pad(size)} latent ${unit} are padding.` : ".") +
      (dp > 1 ? ` ${dp} replicas (dp) decode different latents, each on its own ${tp} devices.` : "");
}
ui.drawMesh = drawMesh;

function showModel(model) {
  ui.model = model;
  $("model").textContent = `${model.id}: ${model.config._class_name || "VAE"}, ${model.dtype}, ` +
    `${model.latents.channels} latent channels, ${model.latents.spatial_scale}x spatial, ` +
    `${model.latents.temporal_scale}x temporal`;
  const banner = $("banner");
  banner.hidden = !model.random_weights;
  banner.textContent = model.random_weights
    ? `This server's model (${model.id}) has random weights: it decodes noise, not video — a test model. ` +
      "Serve real weights with vaeserve serve --model PATH."
    : "";
  $("programs").replaceChildren(...model.compiled.map(([name, shape, output]) => {
    const row = document.createElement("tr");
    for (const text of [name, shape.join("x"), output]) row.insertCell().textContent = text;
    return row;
  }));
  drawMesh();
}

ui.showModel = showModel;

async function refresh() {
  try {
    const text = await (await fetch("/metrics")).text();
    const rows = [["waiting for the device", metric(text, "vaeserve_queue_depth")],
                  ["MP4 encoders at work", metric(text, "vaeserve_encoders_busy")],
                  ["frames held for readers (MB)", (metric(text, "vaeserve_stream_buffered_bytes") / 1e6).toFixed(1)],
                  ["frames decoded (all requests)", metric(text, "vaeserve_frames_decoded_total")]];
    $("queue").replaceChildren(...rows.map(([name, value]) => {
      const row = document.createElement("tr");
      row.insertCell().textContent = name;
      row.insertCell().textContent = value;
      return row;
    }));
    const models = await fetch("/v1/models", { headers: headers() });
    if (models.ok) showModel((await models.json()).data[0]);
    else $("model").textContent = models.status === 401 ? "an API key is needed to read the model" : `model: ${models.status}`;
  } catch (error) {
    $("model").textContent = `service unreachable: ${error.message || error}`;
  }
}
refresh();
setInterval(refresh, 1000);
