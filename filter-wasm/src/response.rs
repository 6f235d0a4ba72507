//! What a response says about itself, read chunk by chunk as it passes: the
//! `usage` object (of a JSON body, or of the SSE event that carries it) and,
//! for SSE, whether the stream reached `data: [DONE]`. One pass, byte by byte,
//! whatever the chunk boundaries; nothing is kept but the usage object itself
//! (bounded). The result reaches Envoy's access log as a [`UsageTag`].

use serde::Deserialize;

use crate::contract::UsageTag;

const KEY: &[u8] = b"\"usage\"";
/// `data: [DONE]` at the start of a line.
const DONE: &[u8] = b"\ndata: [DONE]";
/// A usage object larger than this is not one we can use.
const MAX_OBJECT: usize = 4096;

#[derive(Debug)]
enum State {
    /// Looking for the `"usage"` key; how much of it matched so far.
    Seek(usize),
    /// Found the key: skipping `:` and blanks up to the value.
    Value,
    /// Inside the object: its bytes so far, brace depth, string state.
    Object {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

/// Scans one response body.
#[derive(Debug)]
pub struct UsageScanner {
    state: State,
    object: Vec<u8>,
    /// How much of [`DONE`] matched; starts at 1 (the body begins a line).
    done_matched: usize,
    pub tag: UsageTag,
}

impl Default for UsageScanner {
    fn default() -> Self {
        UsageScanner {
            state: State::Seek(0),
            object: Vec::new(),
            done_matched: 1,
            tag: UsageTag::default(),
        }
    }
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// One step of matching a needle whose only border is its first byte.
fn step(needle: &[u8], matched: usize, b: u8) -> usize {
    if b == needle[matched] {
        matched + 1
    } else if b == needle[0] {
        1
    } else {
        0
    }
}

impl UsageScanner {
    /// Feeds the next chunk. Returns true when the tag changed (usage found,
    /// or the stream's end seen): the moment to hand it to Envoy again.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        let mut changed = false;
        for &b in chunk {
            if !self.tag.done {
                self.done_matched = step(DONE, self.done_matched, b);
                if self.done_matched == DONE.len() {
                    self.tag.done = true;
                    changed = true;
                }
            }
            match &mut self.state {
                State::Seek(m) => {
                    *m = step(KEY, *m, b);
                    if *m == KEY.len() {
                        self.state = State::Value;
                    }
                }
                State::Value => match b {
                    b':' | b' ' | b'\t' | b'\r' | b'\n' => {}
                    b'{' => {
                        self.object.clear();
                        self.object.push(b);
                        self.state = State::Object {
                            depth: 1,
                            in_string: false,
                            escaped: false,
                        };
                    }
                    // `null` or anything else: look for the next one.
                    _ => self.state = State::Seek(step(KEY, 0, b)),
                },
                State::Object {
                    depth,
                    in_string,
                    escaped,
                } => {
                    if self.object.len() == MAX_OBJECT {
                        self.state = State::Seek(0);
                        continue;
                    }
                    self.object.push(b);
                    if *in_string {
                        if *escaped {
                            *escaped = false;
                        } else if b == b'\\' {
                            *escaped = true;
                        } else if b == b'"' {
                            *in_string = false;
                        }
                    } else if b == b'"' {
                        *in_string = true;
                    } else if b == b'{' {
                        *depth += 1;
                    } else if b == b'}' {
                        *depth -= 1;
                        if *depth == 0 {
                            self.state = State::Seek(0);
                            changed |= self.parse_object();
                        }
                    }
                }
            }
        }
        changed
    }

    fn parse_object(&mut self) -> bool {
        let Ok(u) = serde_json::from_slice::<Usage>(&self.object) else {
            return false;
        };
        self.tag.usage = Some((
            u.prompt_tokens,
            u.completion_tokens,
            u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        ));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STREAM: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"usage\\\": {\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n\
data: [DONE]\n\n";

    fn scan(chunks: &[&[u8]]) -> UsageTag {
        let mut s = UsageScanner::default();
        for c in chunks {
            s.push(c);
        }
        s.tag
    }

    #[test]
    fn json_body() {
        let t = scan(&[br#"{"id":"x","usage": {"prompt_tokens":5,"completion_tokens":1}}"#]);
        assert_eq!(t.usage, Some((5, 1, None)), "no details: cached unknown");
        assert!(!t.done);
        assert_eq!(scan(&[b"{}"]).usage, None);
        assert_eq!(scan(&[b"not json \"usage\": {oops}"]).usage, None);
    }

    #[test]
    fn done_only_at_a_line_start() {
        assert!(!scan(&[b"data: {\"c\":\"x data: [DONE]\"}\n"]).done);
        assert!(scan(&[b"data: [DONE]\n"]).done);
        assert!(scan(&[b"data: {}\n\ndata: [DO", b"NE]\n\n"]).done);
    }

    #[test]
    fn oversized_usage_is_dropped_not_kept() {
        let mut body = b"{\"usage\":{\"x\":\"".to_vec();
        body.extend(std::iter::repeat_n(b'a', 10_000));
        body.extend_from_slice(b"\"}}");
        let mut s = UsageScanner::default();
        s.push(&body);
        assert_eq!(s.tag.usage, None);
        assert!(s.object.len() <= MAX_OBJECT);
    }

    proptest! {
        #[test]
        fn sse_whatever_the_chunking(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..12)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut s = UsageScanner::default();
            let mut start = 0;
            for c in cuts.into_iter().chain([STREAM.len()]) {
                s.push(&STREAM.as_bytes()[start..c]);
                start = c;
            }
            prop_assert!(s.tag.done);
            prop_assert_eq!(s.tag.usage, Some((40, 2, Some(32))));
        }

        #[test]
        fn any_bytes_stay_bounded(body in proptest::collection::vec(any::<u8>(), 0..20_000)) {
            let mut s = UsageScanner::default();
            s.push(&body);
            prop_assert!(s.object.len() <= MAX_OBJECT);
        }
    }
}
