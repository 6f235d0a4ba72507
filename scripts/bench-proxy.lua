-- wrk script for scripts/bench-proxy.sh: non-streaming chat completions with
-- max_tokens 1, so the engine answers at once and the proxy is what is measured.
-- Every response is checked; done() prints one machine-readable BENCH line.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bad = 0          -- non-200 responses seen by this thread
  first_bad = ""   -- the first one, to say what went wrong
  next_req = 0
  -- 64 users, so fleetroute sees 64 routing keys and the weighted policy
  -- spreads them over both fleets. Built once: formatting per request would
  -- cost wrk CPU that the proxy under test needs.
  -- PROMPT_BYTES (the prompt-size sweep): a few users with a prompt of that
  -- size instead, so wrk's memory stays small at 1 MB prompts.
  local prompt_bytes = tonumber(os.getenv("PROMPT_BYTES") or "")
  -- MODEL, STREAM=1 and MAX_TOKENS (scripts/bench-rename.sh): another stage,
  -- a streamed answer, a longer one.
  local model = os.getenv("MODEL") or "demo-model"
  local stream = os.getenv("STREAM") == "1"
  local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "") or 1
  local users, content = 64, "Say hello"
  if prompt_bytes then
    users = 4
    local words = "lorem ipsum dolor sit amet consectetur "
    content = string.rep(words, math.ceil(prompt_bytes / #words)):sub(1, prompt_bytes)
  end
  reqs = {}
  for i = 1, users do
    local body = string.format(
      '{"model":"%s","user":"bench-user-%d",' ..
      '"messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":%s}',
      model, i, content, max_tokens, tostring(stream))
    reqs[i] = wrk.format("POST", "/v1/chat/completions",
      { ["Content-Type"] = "application/json" }, body)
  end
end

function request()
  next_req = next_req % #reqs + 1
  return reqs[next_req]
end

function response(status, headers, body)
  if status ~= 200 then
    bad = bad + 1
    if first_bad == "" then
      first_bad = status .. " " .. string.sub(body or "", 1, 200):gsub("%s+", " ")
    end
  end
end

function done(summary, latency, requests)
  local non200, first = 0, ""
  for _, t in ipairs(threads) do
    non200 = non200 + t:get("bad")
    if first == "" then first = t:get("first_bad") end
  end
  local e = summary.errors
  -- Latencies are in microseconds.
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d non200=%d " ..
    "connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), non200,
    e.connect, e.read, e.write, e.timeout))
  if first ~= "" then
    io.write("BENCH first_non200: " .. first .. "\n")
  end
end
