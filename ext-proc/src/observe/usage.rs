//! Token usage from a response body: the `usage` object of a JSON response,
//! or of the SSE event that carries it. Only the usage object is parsed.

use serde::Deserialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}

impl Usage {
    /// `None` when the engine does not report it (vLLM only does with
    /// `--enable-prompt-tokens-details`): unknown, not zero.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.map(|d| d.cached_tokens)
    }
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<Usage>,
}

/// The usage of a whole JSON response body, if it has one.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body).ok()?.usage
}

/// Largest non-streamed response body kept to read its usage.
pub const MAX_JSON_BODY: usize = 4 << 20;

/// A non-streamed body, collected up to [`MAX_JSON_BODY`]. A larger one is
/// dropped whole: reading on with the chunks that still fit would splice a
/// document the engine never sent.
#[derive(Debug, Default)]
pub struct JsonBody {
    buf: Vec<u8>,
    over: bool,
}

impl JsonBody {
    pub fn push(&mut self, chunk: &[u8]) {
        if self.over {
            return;
        }
        if self.buf.len() + chunk.len() <= MAX_JSON_BODY {
            self.buf.extend_from_slice(chunk);
        } else {
            self.over = true;
            self.buf = Vec::new();
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        if self.over {
            None
        } else {
            from_json(&self.buf)
        }
    }

    /// Bytes held (at most [`MAX_JSON_BODY`]).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// Reads an SSE stream chunk by chunk, whatever the chunk boundaries.
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: the rest of it is skipped, so a
    /// line is never spliced together from the parts that happened to fit.
    overlong: bool,
    pub usage: Option<Usage>,
    pub done: bool,
}

/// A longer line is not an event we can use; drop it rather than grow.
pub const MAX_LINE: usize = 1 << 20;

impl SseReader {
    pub fn push(&mut self, mut chunk: &[u8]) {
        while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            if !self.overlong && self.line.len() + nl <= MAX_LINE {
                self.line.extend_from_slice(&chunk[..nl]);
                let line = std::mem::take(&mut self.line);
                self.on_line(&line);
                self.line = line;
            }
            self.line.clear();
            self.overlong = false;
            chunk = &chunk[nl + 1..];
        }
        if self.overlong {
            return;
        }
        if self.line.len() + chunk.len() <= MAX_LINE {
            self.line.extend_from_slice(chunk);
        } else {
            self.overlong = true;
            self.line.clear();
        }
    }

    /// Bytes held for the unfinished line (at most [`MAX_LINE`]).
    pub fn buffered(&self) -> usize {
        self.line.len()
    }

    fn on_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
        } else if mentions_usage(data)
            && let Some(u) = from_json(data)
        {
            self.usage = Some(u);
        }
    }
}

/// Only events that mention usage are parsed at all.
fn mentions_usage(data: &[u8]) -> bool {
    data.windows(7).any(|w| w == b"\"usage\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STREAM: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn json_usage() {
        let u =
            from_json(br#"{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":1}}"#).unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
            (5, 1, None),
            "no prompt_tokens_details: cached tokens unknown, not zero"
        );
        assert!(from_json(b"{}").is_none());
        assert!(from_json(b"not json").is_none());
    }

    proptest! {
        #[test]
        fn sse_usage_whatever_the_chunking(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..10)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut r = SseReader::default();
            let mut start = 0;
            for c in cuts.into_iter().chain([STREAM.len()]) {
                r.push(&STREAM.as_bytes()[start..c]);
                start = c;
            }
            prop_assert!(r.done);
            prop_assert_eq!(r.usage.and_then(|u| u.cached_tokens()), Some(32));
        }
    }
}
