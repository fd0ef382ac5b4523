"use strict";
// What a test (or a curious person) can read: set as things happen.
const ui = window.vaeserveUi = { latents: null, requestId: null, status: null, responseEnded: false,
  firstBytesAt: null, startedAt: null, endedAt: null, errors: [] };
window.addEventListener("error", e => ui.errors.push(String(e.message)));
window.addEventListener("unhandledrejection", e => ui.errors.push(String(e.reason)));
const $ = id => document.getElementById(id);
let tp = 1;

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}
function headers() {
  const key = $("key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

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
    drawBands();
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

// ---- decoding ---------------------------------------------------------------------------------
async function problemText(response) {
  try { const p = await response.json(); return `${p.status} ${p.title}: ${p.detail}`; }
  catch { return `${response.status} ${response.statusText}`; }
}

$("decode").addEventListener("click", async () => {
  const latents = ui.latents, mode = $("output").value;
  Object.assign(ui, { responseEnded: false, firstBytesAt: null, endedAt: null,
                      startedAt: performance.now(), status: null, requestId: null });
  const query = new URLSearchParams({ fps: $("fps").value, denormalize: $("denormalize").checked });
  if (mode !== "frames") query.set("output_type", "mp4");
  if (mode !== "mp4") query.set("stream", "true");
  if (latents.raw) { query.set("shape", latents.shape.join(",")); query.set("dtype", latents.dtype); }
  $("decode").disabled = true;
  say("sending…");
  try {
    const response = await fetch(`/v1/decode?${query}`, { method: "POST", body: latents.body,
      headers: { "Content-Type": latents.contentType, ...headers() } });
    ui.status = response.status;
    ui.requestId = response.headers.get("X-Request-Id");
    if (!response.ok) { say(await problemText(response), true); return; }
    if (mode === "mp4-stream") await playFragments(response);
    else if (mode === "mp4") await playWhole(response);
    else await drawFrames(response);
    ui.endedAt = performance.now();
    const first = ui.firstBytesAt === null ? "" : `first playable bytes after ${((ui.firstBytesAt - ui.startedAt) / 1000).toFixed(2)} s, `;
    say(`request ${ui.requestId}: ${first}answer complete after ${((ui.endedAt - ui.startedAt) / 1000).toFixed(2)} s`);
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

async function playFragments(response) {
  const video = $("video"), source = new MediaSource();
  $("canvas").hidden = true; video.hidden = false;
  video.src = URL.createObjectURL(source);
  await once(source, "sourceopen");
  const reader = response.body.getReader();
  let buffer = null, pending = [];
  const append = async data => {
    buffer.appendBuffer(data);
    await once(buffer, "updateend");
  };
  let head = new Uint8Array(0);
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (buffer === null) {  // wait for the init segment (ftyp + moov) to learn the codec
      const joined = new Uint8Array(head.length + value.length);
      joined.set(head); joined.set(value, head.length); head = joined;
      const codec = codecOf(head);
      if (codec === null) continue;
      buffer = source.addSourceBuffer(`video/mp4; codecs="${codec}"`);
      pending = [head];
    } else {
      pending = [value];
    }
    for (const data of pending) await append(data);
    if (ui.firstBytesAt === null && buffer.buffered.length) {
      ui.firstBytesAt = performance.now();
      video.play().catch(() => {});
    }
  }
  if (buffer !== null && source.readyState === "open") source.endOfStream();
}

async function playWhole(response) {
  const blob = await response.blob();
  ui.firstBytesAt = performance.now();
  $("canvas").hidden = true; $("video").hidden = false;
  $("video").src = URL.createObjectURL(blob);
  $("video").play().catch(() => {});
}

// The raw frame stream (application/x-vaeserve-stream): u32 LE header length, JSON header, payload.
async function drawFrames(response) {
  const canvas = $("canvas"), context = canvas.getContext("2d"), reader = response.body.getReader();
  canvas.hidden = false; $("video").hidden = true;
  let data = new Uint8Array(0);
  const frames = [];
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
        const payload = data.subarray(4 + length, 4 + length + header.nbytes);
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
        if (ui.firstBytesAt === null) ui.firstBytesAt = performance.now();
      }
    }
    while (frames.length) await new Promise(resolve => setTimeout(resolve, 1000 / fps));
  } finally {
    clearInterval(timer);
  }
}

// ---- the service beside it: queue, mesh and bands, compiled programs --------------------------
function metric(text, name) {
  const match = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
  return match ? Number(match[1]) : null;
}

// The band layout of sharding/bands.py: the axis that needs less padding (ties: height), split
// into tp bands of ceil(size / tp) latent rows, the last ones padded.
function drawBands() {
  const bands = $("bands");
  bands.innerHTML = "";
  if (!ui.latents) return;
  const [height, width] = ui.latents.shape.slice(-2);
  const band = size => Math.ceil(size / tp), pad = size => band(size) * tp - size;
  const split = pad(height) <= pad(width) ? "height" : "width";
  const size = split === "height" ? height : width;
  bands.style.flexDirection = split === "height" ? "column" : "row";
  bands.style.aspectRatio = `${width} / ${height}`;
  for (let rank = 0; rank < tp; rank++) {
    const rows = Math.max(0, Math.min(band(size), size - rank * band(size)));
    const cell = document.createElement("div");
    cell.style.background = `hsl(${(rank * 360) / tp}, 55%, 45%)`;
    cell.textContent = `device ${rank}: ${rows} ${split === "height" ? "rows" : "columns"}`;
    bands.appendChild(cell);
  }
}

async function refresh() {
  try {
    const text = await (await fetch("/metrics")).text();
    const rows = [["waiting for the device", metric(text, "vaeserve_queue_depth")],
                  ["MP4 encoders at work", metric(text, "vaeserve_encoders_busy")],
                  ["frames held for readers (MB)", (metric(text, "vaeserve_stream_buffered_bytes") / 1e6).toFixed(1)],
                  ["frames decoded", metric(text, "vaeserve_frames_decoded_total")]];
    $("queue").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("");
    const models = await fetch("/v1/models", { headers: headers() });
    if (models.ok) {
      const model = (await models.json()).data[0];
      tp = model.mesh.tp;
      $("mesh").textContent = `${model.id}: dp=${model.mesh.dp} x tp=${model.mesh.tp} on ${model.mesh.devices.length} ` +
        `device(s), ${model.mesh.processes} process(es), ${model.dtype}`;
      $("programs").innerHTML = model.compiled.map(p => `<tr><td>${p[0]}</td><td>${p[1].join("x")}</td><td>${p[2]}</td></tr>`).join("");
      drawBands();
    } else {
      $("mesh").textContent = models.status === 401 ? "an API key is needed to read the model" : `model: ${models.status}`;
    }
  } catch (error) {
    $("mesh").textContent = `service unreachable: ${error.message || error}`;
  }
}
refresh();
setInterval(refresh, 1000);
