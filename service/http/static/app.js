"use strict";
// The page of GET /ui: it calls the public API like any client (the API key typed into it, when one
// is set). Static (no inline script or style), so that it runs under a strict Content-Security-Policy.

// What a test (or a curious person) can read: set as things happen.
const ui = window.vaeserveUi = { latents: null, model: null, requestId: null, status: null, responseEnded: false,
  firstBytesAt: null, startedAt: null, sentAt: null, endedAt: null, framesReceived: 0, framesTotal: null, download: null,
  images: [], phase: null, phases: [], said: [], sent: [0, 0], compiledAfter: null, firstOfSize: false, fps: 16,
  streaming: false, errors: [] };
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
  return { shape, dtype: DTYPES[descr] || descr, body: bytes, contentType: "application/x-npy",
           data: bytes.subarray(start + length) };
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

// ---- the model: what its latents are, and which programs the server holds for them -------------
const isImage = () => Boolean(ui.model && ui.model.latents.is_image);

// Inputs in a request of latents `shape`: B of (B, C, T, H, W) or, for an image model, of (B, C, H, W)
// (Qwen-Image also takes (B, C, 1, H, W)); 1 without the batch axis.
function batchOf(shape) {
  if (isImage()) return shape.length === 3 ? 1 : shape[0];
  return shape.length === 5 ? shape[0] : 1;
}

// What a decode of these latents yields: images (one per input of the batch) or frames, 1 +
// temporal_scale (T − 1) per video.
function outputsOf(shape) {
  if (!ui.model) return null;
  if (isImage()) return batchOf(shape);
  const [t] = shape.slice(-3, -2);
  return batchOf(shape) * (1 + ui.model.latents.temporal_scale * (t - 1));
}

// The decode programs GET /v1/models lists for latents `shape` at the size the server pads its
// batch to (batch_buckets): the same channels, height and width (and clip length, for a model that
// decodes the whole clip at once). None listed means that this request compiles them: the first
// request of a size compiles its programs, which takes seconds to minutes. The page's answers
// are uint8 frames of whole clips, so float programs (the pt tensors of other clients) and
// HunyuanVideo 1.0's framewise ones do not count.
function programsFor(shape) {
  const { latents, batch_buckets: buckets, compiled } = ui.model;
  const [height, width] = shape.slice(-2), batch = batchOf(shape);
  const bucket = buckets.find(size => size >= batch) || batch;
  const length = !latents.is_image && !latents.causal ? shape.at(-3) : null;
  return compiled.filter(([name, size, variant]) => name !== "encode" && !/float|framewise/.test(variant) &&
    size[0] === bucket && size[1] === latents.channels && size.at(-2) === height && size.at(-1) === width &&
    (length === null || size.at(-3) === length));
}

// ---- one request: XMLHttpRequest, for what fetch does not tell -----------------------------------
// fetch says nothing of a request body on its way (its upload streams need HTTP/2), and the page
// must know when the latents have been sent: from then on, the wait is the server's (compiling a
// new size, decoding). XMLHttpRequest tells (upload progress and load), and its answer is read as it
// arrives: the body as text in the x-user-defined charset, each byte one character
// (U+0000–U+007F, or U+F780–U+F7FF for bytes 0x80–0xFF), handed on as byte chunks.
class Chunks {
  constructor() { this.items = []; this.ended = false; this.error = null; this.wake = null; }
  put(chunk) { this.items.push(chunk); this.notify(); }
  end(error = null) { if (!this.ended) { this.ended = true; this.error = error; this.notify(); } }
  notify() { const wake = this.wake; this.wake = null; if (wake) wake(); }
  async read() {
    while (!this.items.length && !this.ended) await new Promise(resolve => { this.wake = resolve; });
    if (this.items.length) return { done: false, value: this.items.shift() };
    if (this.error) throw this.error;
    return { done: true, value: undefined };
  }
  async all() {
    const parts = [];
    for (;;) {
      const { done, value } = await this.read();
      if (done) return joined(parts);
      parts.push(value);
    }
  }
}

function joined(parts) {
  const out = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let at = 0;
  for (const part of parts) { out.set(part, at); at += part.length; }
  return out;
}

function post(url, body, headers, { sending, sent }) {
  const xhr = new XMLHttpRequest(), chunks = new Chunks();
  let taken = 0;
  const take = () => {
    const text = xhr.responseText;
    if (text.length <= taken) return;
    const bytes = new Uint8Array(text.length - taken);
    for (let i = taken; i < text.length; i++) bytes[i - taken] = text.charCodeAt(i) & 0xff;
    taken = text.length;
    chunks.put(bytes);
  };
  const answered = new Promise((resolve, reject) => {
    xhr.onreadystatechange = () => { if (xhr.readyState >= XMLHttpRequest.HEADERS_RECEIVED) resolve(xhr); };
    xhr.onerror = () => {
      reject(new Error("no answer (the connection failed)"));
      chunks.end(new Error("the answer was cut off"));
    };
  });
  xhr.open("POST", url);
  xhr.overrideMimeType("text/plain; charset=x-user-defined");
  for (const [name, value] of Object.entries(headers)) xhr.setRequestHeader(name, value);
  xhr.upload.onprogress = event => sending(event.loaded, event.total);
  xhr.upload.onload = sent;
  xhr.onprogress = take;
  xhr.onload = () => { take(); chunks.end(); };
  xhr.send(body);
  return { answered, chunks };
}

// ---- what the page says while a request runs -------------------------------------------------------
// The phase of this request, from what the page can know: "sending" (upload progress), then, once
// the latents are sent and no answer has come, "compiling" when no program of this size was listed
// (an image model's one program appearing in GET /v1/models ends it; a video's first frames do), or
// "decoding"; the time since the latents were sent runs beside it. Then the answer's own progress:
// frames counted from a stream, bytes received of a whole answer.
function setPhase(phase) {
  if (ui.phase === phase) return;
  ui.phase = phase;
  ui.phases.push(phase);
  if (phase === "decoding" && ui.sentAt !== null && ui.phases.includes("compiling")) ui.compiledAfter = seconds(ui.sentAt);
  if (phase === "compiling" || phase === "decoding") {  // no count yet: the bar runs without a value
    const total = ui.framesTotal ? `${ui.framesTotal} ` : "", noun = isImage() ? "images" : "frames";
    showProgress(0, ui.streaming ? "waiting for the first frames" : `${total}${noun}, answered whole once decoded`, 0);
  }
  tell();
  ui.said.push($("status").textContent);  // what the page said in each phase (a test reads it)
}

function tell() {
  const waited = ui.sentAt === null ? "" : `: ${Math.floor((performance.now() - ui.sentAt) / 1000)} s`;
  const compiled = ui.compiledAfter === null ? "" : ` (this size compiled in ${ui.compiledAfter} s)`;
  const texts = {
    sending: `sending ${ui.latents.name}: ${megabytes(ui.sent[0])} of ${megabytes(ui.sent[1])} MB`,
    compiling: `compiling this size (first request)${waited}`,
    decoding: `decoding${waited}${compiled}`,
    answering: `request ${ui.requestId}: ${ui.streaming ? "decoding, its frames shown as they arrive" : "receiving the answer"}`,
  };
  if (ui.phase in texts) say(texts[ui.phase]);
}

function watch() {
  // The clock runs in whole seconds; GET /v1/models (refresh, every second) ends an image's compiling.
  const timer = setInterval(() => {
    if (ui.phase === "compiling" && isImage() && programsFor(ui.latents.shape).length) setPhase("decoding");
    tell();
  }, 250);
  return () => clearInterval(timer);
}

function showProgress(count, what, total = ui.framesTotal) {
  ui.framesReceived = count;
  const bar = $("progress");
  bar.hidden = false;
  if (total) { bar.max = total; bar.value = count; } else bar.removeAttribute("value");
  $("frames").textContent = what;
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
function problemText(bytes, xhr) {
  try {
    const p = JSON.parse(new TextDecoder().decode(bytes));
    return `${p.status} ${p.title}: ${p.detail}`;
  } catch { return `${xhr.status} ${xhr.statusText}`; }
}

// What the page asks for: an image model's images as PNG (a batch as raw uint8 frames, made into
// PNGs here: a PNG holds one image), a video as the output chosen.
function queryFor(latents, mode) {
  const query = new URLSearchParams({ denormalize: $("denormalize").checked });
  if (mode === "png") query.set("output_type", batchOf(latents.shape) > 1 ? "npy" : "png");
  else {
    query.set("fps", $("fps").value);
    if (mode !== "frames") query.set("output_type", "mp4");
    if (mode !== "mp4") query.set("stream", "true");
  }
  if (latents.raw) { query.set("shape", latents.shape.join(",")); query.set("dtype", latents.dtype); }
  return query;
}

$("decode").addEventListener("click", async () => {
  const latents = ui.latents, mode = $("output").value;
  Object.assign(ui, { responseEnded: false, firstBytesAt: null, endedAt: null, startedAt: performance.now(),
                      sentAt: null, status: null, requestId: null, framesReceived: 0,
                      framesTotal: outputsOf(latents.shape), download: null, images: [], pngs: [], phase: null, phases: [],
                      said: [], sent: [0, latents.body.length], compiledAfter: null, fps: Number($("fps").value) || 16,
                      streaming: mode === "mp4-stream" || mode === "frames",
                      firstOfSize: ui.model ? programsFor(latents.shape).length === 0 : false });
  $("decode").disabled = true;
  $("download").hidden = true;
  $("frames").textContent = "";
  $("progress").hidden = true;
  const stop = watch();
  try {
    setPhase("sending");
    const route = ui.model ? `/v1/models/${encodeURIComponent(ui.model.id)}/decode` : "/v1/decode";
    const request = post(`${route}?${queryFor(latents, mode)}`, latents.body,
      { "Content-Type": latents.contentType, ...headers() }, {
        sending: (loaded, total) => { ui.sent = [loaded, total]; tell(); },
        sent: () => {
          ui.sentAt = performance.now();
          if (ui.phase === "sending") setPhase(ui.firstOfSize ? "compiling" : "decoding");  // not once answered
        },
      });
    const xhr = await request.answered;
    ui.status = xhr.status;
    ui.requestId = xhr.getResponseHeader("X-Request-Id");
    stop();
    if (xhr.status !== 200) {
      $("progress").hidden = true;
      $("frames").textContent = "";
      say(problemText(await request.chunks.all(), xhr), true);
      return;
    }
    setPhase("answering");
    if (mode === "mp4-stream") await playFragments(request.chunks);
    else if (mode === "frames") await drawFrames(request.chunks);
    else await takeWhole(xhr, request.chunks, mode);
    ui.endedAt = performance.now();
    say(`request ${ui.requestId}: ${summary(xhr)}`);
  } catch (error) {
    const cut = ui.status === 200 ? " (an answer cut off: the server log names the problem)" : "";
    say(`request ${ui.requestId || "?"}: ${error.message || error}${cut}`, true);
  } finally {
    stop();
    ui.phase = "done";
    ui.responseEnded = true;
    $("decode").disabled = false;
  }
});

// How the request went: its first frame (a stream's) and its end, and where the time went — the device time
// and queue time the server reports for a whole answer, and whether this size was compiled for it.
function summary(xhr) {
  const what = isImage() ? `${ui.framesReceived} image${ui.framesReceived === 1 ? "" : "s"}` : `${ui.framesReceived} frames`;
  const first = ui.firstBytesAt === null || !ui.streaming ? ""
    : `first frame after ${((ui.firstBytesAt - ui.startedAt) / 1000).toFixed(2)} s, `;
  const device = xhr.getResponseHeader("X-Device-Time-S"), queued = xhr.getResponseHeader("X-Queue-Time-S");
  const compiled = ui.firstOfSize ? ", compiling this size included" : "";
  const server = device === null ? (ui.firstOfSize ? " (this size compiled first)" : "")
    : ` (${Number(device).toFixed(2)} s on the device${compiled}, ${Number(queued).toFixed(2)} s queued)`;
  return `${first}all ${what} after ${seconds(ui.startedAt)} s${server}`;
}

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
    this.data = joined([this.data, chunk]);
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
  for (const id of ["video", "canvas", "images"]) $(id).hidden = element !== id;
  $("player").hidden = element !== "video";
}

const counted = (count, total, noun) => `${count}${total ? ` of ${total}` : ""} ${noun}`;

async function playFragments(chunks) {
  const video = $("video"), source = new MediaSource(), boxes = new BoxCounter(), kept = [];
  show("video");
  video.src = URL.createObjectURL(source);
  await once(source, "sourceopen");
  let buffer = null, head = new Uint8Array(0);
  const append = async data => {
    buffer.appendBuffer(data);
    await once(buffer, "updateend");
  };
  for (;;) {
    const { done, value } = await chunks.read();
    if (done) break;
    kept.push(value);
    boxes.push(value);
    if (buffer === null) {  // wait for the init segment (ftyp + moov) to learn the codec
      head = joined([head, value]);
      const codec = codecOf(head);
      if (codec === null) continue;
      buffer = source.addSourceBuffer(`video/mp4; codecs="${codec}"`);
      await append(head);
    } else {
      await append(value);
    }
    showProgress(boxes.frames, `playing while it decodes: ${counted(boxes.frames, ui.framesTotal, "frames")}`);
    if (ui.firstBytesAt === null && buffer.buffered.length) {
      ui.firstBytesAt = performance.now();
      video.play().catch(() => {});
    }
  }
  if (buffer !== null && source.readyState === "open") source.endOfStream();
  showProgress(boxes.frames, `decoded: ${counted(boxes.frames, ui.framesTotal, "frames")}`);
  offerDownload(new Blob(kept, { type: "video/mp4" }), "video.mp4");
}

// A whole answer: its bytes counted as they arrive (Content-Length), then shown — an MP4, a PNG, or
// a batch of images as raw frames (B, H, W, 3), each made a PNG here.
async function takeWhole(xhr, chunks, mode) {
  const total = Number(xhr.getResponseHeader("Content-Length")) || 0, parts = [];
  let received = 0;
  for (;;) {
    const { done, value } = await chunks.read();
    if (done) break;
    parts.push(value);
    received += value.length;
    showProgress(received, `receiving: ${megabytes(received)}${total ? ` of ${megabytes(total)}` : ""} MB`, total);
  }
  ui.firstBytesAt = performance.now();
  const body = joined(parts), count = ui.framesTotal || 0;
  if (mode === "mp4") {
    const blob = new Blob([body], { type: "video/mp4" });
    show("video");
    $("video").src = URL.createObjectURL(blob);
    $("video").play().catch(() => {});
    showProgress(count, `decoded: ${counted(count, count, "frames")}`, count);
    offerDownload(blob, "video.mp4");
    return;
  }
  const images = xhr.getResponseHeader("Content-Type").startsWith("image/png")
    ? [new Blob([body], { type: "image/png" })] : await pngsOf(body);
  showImages(images);
  showProgress(images.length, `decoded: ${counted(images.length, images.length, images.length === 1 ? "image" : "images")}`,
               images.length);
}

// uint8 images (B, H, W, 3) or (H, W, 3) in a .npy answer, each as a PNG (drawn on a canvas).
async function pngsOf(bytes) {
  const { shape, data } = readNpy(bytes);
  const [h, w] = shape.slice(-3, -1), count = shape.length === 4 ? shape[0] : 1;
  const canvas = document.createElement("canvas"), context = canvas.getContext("2d");
  canvas.width = w; canvas.height = h;
  const pngs = [];
  for (let i = 0; i < count; i++) {
    context.putImageData(imageOf(data.subarray(i * h * w * 3, (i + 1) * h * w * 3), context, w, h), 0, 0);
    pngs.push(await new Promise(resolve => canvas.toBlob(resolve, "image/png")));
  }
  return pngs;
}

// RGB bytes (H, W, 3) as the RGBA ImageData a canvas draws.
function imageOf(rgb, context, w, h) {
  const image = context.createImageData(w, h);
  for (let p = 0, q = 0; p < h * w; p++, q += 3) {
    image.data.set(rgb.subarray(q, q + 3), p * 4);
    image.data[p * 4 + 3] = 255;
  }
  return image;
}

function showImages(pngs) {
  const box = $("images");
  for (const old of box.querySelectorAll("img")) URL.revokeObjectURL(old.src);
  box.replaceChildren();
  box.className = pngs.length === 1 ? "images one" : "images";
  ui.images = [];
  ui.pngs = pngs;  // the files themselves (their blob: URLs are for the page's elements, not for fetch)
  pngs.forEach((png, index) => {
    const name = pngs.length === 1 ? "image.png" : `image-${index + 1}.png`;
    const figure = document.createElement("figure"), img = document.createElement("img");
    const link = document.createElement("a");
    img.src = link.href = URL.createObjectURL(png);
    img.alt = name;
    link.download = name;
    link.textContent = `${name} (${(png.size / 1e3).toFixed(1)} kB)`;
    figure.append(img, link);
    box.appendChild(figure);
    ui.images.push({ name, bytes: png.size });
  });
  show("images");
  if (pngs.length === 1) offerDownload(pngs[0], "image.png");
}

// The raw frame stream (application/x-vaeserve-stream): u32 LE header length, JSON header, payload.
async function drawFrames(chunks) {
  const canvas = $("canvas"), context = canvas.getContext("2d");
  show("canvas");
  let data = new Uint8Array(0), shape = null;
  const frames = [], kept = [];
  const timer = setInterval(() => {
    const frame = frames.shift();
    if (frame) context.putImageData(frame, 0, 0);
  }, 1000 / ui.fps);
  try {
    for (;;) {
      const { done, value } = await chunks.read();
      if (done) break;
      data = joined([data, value]);
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
        for (let i = 0; i < f; i++) frames.push(imageOf(payload.subarray(i * h * w * 3, (i + 1) * h * w * 3), context, w, h));
        kept.push(payload);
        shape = [header.frame_start + f, h, w, 3];
        showProgress(shape[0], `drawn as they decode: ${counted(shape[0], ui.framesTotal, "frames")}`);
        if (ui.firstBytesAt === null) ui.firstBytesAt = performance.now();
      }
    }
    while (frames.length) await new Promise(resolve => setTimeout(resolve, 1000 / ui.fps));
  } finally {
    clearInterval(timer);
  }
  if (shape) offerDownload(npyBlob(kept, shape), "frames.npy");
}

// The player's own controls: the browser's count whole seconds, so a short clip (5 frames at 16
// fps: 0.31 s) read 0:00 / 0:00. These count hundredths of a second and frames, and seek by frame.
function showClock() {
  const video = $("video"), seek = $("seek"), fps = ui.fps || 16;
  const t = video.currentTime, d = video.duration;
  const frames = Number.isFinite(d) && d > 0 ? Math.round(d * fps) : ui.framesReceived;
  const frame = Math.min(frames, Math.floor(t * fps + 1e-6) + 1);
  seek.max = Math.max(0, frames - 1);
  seek.value = Math.max(0, frame - 1);
  $("clock").textContent = `${t.toFixed(2)} s of ${Number.isFinite(d) ? `${d.toFixed(2)} s` : "a video still decoding"}` +
    (frames ? ` · frame ${Math.max(frame, 1)} of ${frames} at ${fps} fps` : "");
  $("play").textContent = video.paused || video.ended ? "Play" : "Pause";
}

function setUpPlayer() {
  const video = $("video");
  for (const event of ["timeupdate", "durationchange", "seeked", "ended", "play", "pause", "loadedmetadata"]) {
    video.addEventListener(event, showClock);
  }
  if ("requestVideoFrameCallback" in video) {  // every frame shown, not only timeupdate's 4 a second
    const onFrame = () => { showClock(); video.requestVideoFrameCallback(onFrame); };
    video.requestVideoFrameCallback(onFrame);
  }
  $("play").addEventListener("click", () => {
    if (video.paused || video.ended) {
      if (video.ended) video.currentTime = 0;
      video.play().catch(() => {});
    } else video.pause();
  });
  $("seek").addEventListener("input", () => {  // the middle of the frame: its start may round to the one before
    video.pause();
    video.currentTime = (Number($("seek").value) + 0.5) / (ui.fps || 16);
  });
  $("loop").addEventListener("change", () => { video.loop = $("loop").checked; });
  $("fullscreen").addEventListener("click", () => video.requestFullscreen().catch(() => {}));
}
setUpPlayer();

// ---- the service beside it: the model, the mesh and its bands, queue, compiled programs ------------
function metric(text, name) {
  const match = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
  return match ? Number(match[1]) : null;
}

// The frame drawn before any latents are loaded: 720p for a video model, 1024x1024 for an image
// model, in latents of the model's spatial scale.
function defaultFrame(scale) {
  const [height, width] = isImage() ? [1024, 1024] : [720, 1280];
  return { latents: [Math.ceil(height / scale), Math.ceil(width / scale)], name: isImage() ? "1024x1024" : "720p" };
}

// The band layout of sharding/bands.py: the axis that needs less padding (ties: height), split into
// tp bands of ceil(size / tp) latent rows (or columns), the last ones padded. Drawn for one frame of
// the latents loaded (or, before any, a default frame), one band per device of a replica; `mesh` is
// GET /v1/models' (dp, tp, devices).
function drawMesh(mesh = ui.model && ui.model.mesh, shape = ui.latents && ui.latents.shape) {
  if (!mesh) return;
  const { dp, tp, devices } = mesh, scale = ui.model ? ui.model.latents.spatial_scale : 8;
  const fallback = defaultFrame(scale);
  const [height, width] = shape ? shape.slice(-2) : fallback.latents;
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
    cell.textContent = tp === 1 ? `device 0: the whole ${isImage() ? "image" : "frame"}` : tp <= 4 ? `device ${rank}: ${rows} ${unit}${padded}`
      : `${rank}${padded}`;
    cell.title = `device ${rank}: latent ${unit} ${rank * band(size)}–${rank * band(size) + rows - 1} ` +
      `(${rows * scale} pixel ${unit})`;
    bands.appendChild(cell);
  }
  const what = isImage() ? "image" : "frame";
  const frame = `${width}×${height} latents, ${width * scale}×${height * scale} pixels` +
    (shape ? "" : `: ${fallback.name}, before any latents are loaded`);
  $("mesh-note").textContent = tp === 1
    ? `One device decodes the whole ${what} (${frame}). With tp = N, N devices would each decode a band of ` +
      `every ${what}, exchanging one-row halos with their neighbours: each holds 1/N of the activations, and the ` +
      `${what}s are the same.`
    : `Each ${what} (${frame}) is split by ${split} into ${tp} bands of ${band(size)} latent ${unit} ` +
      `(${band(size) * scale} pixel ${unit}), one per device, each exchanging one-row halos with its neighbours` +
      (pad(size) ? `; the last ${pad(size)} latent ${unit} are padding.` : ".") +
      (dp > 1 ? ` ${dp} replicas (dp) decode different latents, each on its own ${tp} devices.` : "");
}
ui.drawMesh = drawMesh;

// What the model takes and gives, in words, as rows of the model panel: an image model has no time
// axis (GET /v1/models says temporal_scale null), which is said, never printed as a number.
function describeModel(model) {
  const l = model.latents;
  const scale = l.is_image ? `${l.spatial_scale}x spatial; images, no time axis`
    : `${l.spatial_scale}x spatial, ${l.temporal_scale}x temporal: T latent frames make 1 + ${l.temporal_scale}(T − 1) frames`;
  const frames = l.is_image ? "" : `, ${1 + l.temporal_scale * (l.max_latent_frames - 1)} frames`;
  return [[model.id, `${model.config._class_name || "VAE"}, ${model.dtype}${model.encodes ? ", encodes too" : ""}`],
          ["latents", `${l.layout}, ${l.channels} channels`],
          ["scale", scale],
          ["largest", `${l.max_width}×${l.max_height} pixels${frames}, ${l.max_batch} per request`]];
}

function fillTable(table, cells) {
  table.replaceChildren(...cells.map(texts => {
    const row = document.createElement("tr");
    for (const text of texts) row.insertCell().textContent = text;
    return row;
  }));
}

// The outputs offered: a video model's three; an image model's PNG (one per image of a batch).
const OUTPUTS = {
  video: [["mp4-stream", "MP4, playing while it decodes (fragmented)"], ["mp4", "MP4, the whole file"],
          ["frames", "raw frames, drawn as they decode"]],
  image: [["png", "PNG (a batch: one per image)"]],
};

function offerOutputs(kind) {
  const select = $("output");
  if (select.dataset.kind === kind) return;
  select.dataset.kind = kind;
  select.replaceChildren(...OUTPUTS[kind].map(([value, text]) => new Option(text, value)));
  $("fps-label").hidden = kind === "image";
}

function showModel(model) {
  ui.model = model;
  const kind = model.latents.is_image ? "image" : "video";
  fillTable($("model"), describeModel(model));
  offerOutputs(kind);
  const banner = $("banner");
  banner.hidden = model.random_weights !== true;
  banner.textContent = model.random_weights === true
    ? `This server's model (${model.id}) has random weights: it decodes noise, not ${kind === "image" ? "images" : "video"}` +
      " — a test model. Serve real weights with vaeserve serve --model PATH."
    : "";
  fillTable($("programs"), model.compiled.length ? model.compiled.map(([name, shape, output]) => [name, shape.join("x"), output])
    : [["none yet: each new size compiles on its first request"]]);
  drawMesh();
}

ui.showModel = showModel;

// A server of several models: the page offers them (GET /v1/models' ids) and decodes with the one chosen.
function chosenModel(served) {
  const select = $("model-choice"), ids = served.map(model => model.id);
  if (select.dataset.ids !== JSON.stringify(ids)) {
    select.dataset.ids = JSON.stringify(ids);
    select.replaceChildren(...ids.map(id => new Option(id, id)));
  }
  $("model-label").hidden = served.length < 2;
  return served.find(model => model.id === select.value) || served[0];
}

$("model-choice").addEventListener("change", () => refresh());

const shown = (value, digits = 0) => value === null ? "not reported" : value.toFixed(digits);

async function refresh() {
  try {
    const text = await (await fetch("/metrics")).text();
    const buffered = metric(text, "vaeserve_stream_buffered_bytes");
    const queue = [["waiting for the device", shown(metric(text, "vaeserve_queue_depth"))],
                  ["MP4 encoders at work", shown(metric(text, "vaeserve_encoders_busy"))],
                  ["frames held for readers (MB)", shown(buffered === null ? null : buffered / 1e6, 1)],
                  [`${isImage() ? "images" : "frames"} decoded (all requests)`,
                   shown(metric(text, "vaeserve_frames_decoded_total"))]];
    fillTable($("queue"), queue);
    const models = await fetch("/v1/models", { headers: headers() });
    if (models.ok) showModel(chosenModel((await models.json()).data));
    else fillTable($("model"), [[models.status === 401 ? "an API key is needed to read the model" : `model: ${models.status}`]]);
  } catch (error) {
    fillTable($("model"), [[`service unreachable: ${error.message || error}`]]);
  }
}
refresh();
setInterval(refresh, 1000);
