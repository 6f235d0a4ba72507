//! What the rewriter passes over: the object's structure around its members
//! and every value that is not the `model` string.

use super::{KEY, ModelRewriter, State, Step, is_ws};

impl ModelRewriter {
    /// The object's structure: its opening, keys (is it `model`?), colons and
    /// the commas between members.
    pub(super) fn structure(&mut self, b: u8, i: &mut usize) -> Step {
        match self.state {
            State::Before => {
                *i += 1;
                if b == b'{' {
                    self.state = State::Key;
                } else if !is_ws(b) {
                    self.state = self.past_object();
                }
            }
            State::Key => {
                *i += 1;
                if b == b'"' {
                    self.state = State::KeyName {
                        matched: Some(0),
                        escaped: false,
                    };
                } else if !is_ws(b) {
                    self.state = self.past_object();
                }
            }
            State::KeyName { matched, escaped } => {
                *i += 1;
                self.state = match b {
                    // An escape makes it some other key (engines write keys plainly).
                    _ if escaped => State::KeyName {
                        matched: None,
                        escaped: false,
                    },
                    b'\\' => State::KeyName {
                        matched: None,
                        escaped: true,
                    },
                    b'"' => State::Colon {
                        model: matched == Some(KEY.len() as u8),
                    },
                    _ => State::KeyName {
                        matched: matched
                            .filter(|&n| KEY.get(usize::from(n)) == Some(&b))
                            .map(|n| n + 1),
                        escaped: false,
                    },
                };
            }
            State::Colon { model } => {
                *i += 1;
                if b == b':' {
                    self.state = State::Value { model };
                } else if !is_ws(b) {
                    self.state = self.past_object();
                }
            }
            State::AfterValue => {
                *i += 1;
                if b == b',' {
                    self.state = State::Key;
                } else if !is_ws(b) {
                    self.state = self.past_object();
                }
            }
            _ => {}
        }
        Step::Next
    }

    /// Any other value (string, nested object or array, scalar) is passed
    /// over to its end.
    pub(super) fn skip_value(&mut self, chunk: &[u8], b: u8, i: &mut usize) -> Step {
        match self.state {
            State::Str { escaped: true } => {
                *i += 1;
                self.state = State::Str { escaped: false };
            }
            State::Str { escaped: false } => match Self::string_stop(chunk, *i) {
                None => *i = chunk.len(),
                Some((k, b'"')) => {
                    *i = k + 1;
                    self.state = State::AfterValue;
                }
                Some((k, b'\\')) => {
                    *i = k + 1;
                    self.state = State::Str { escaped: true };
                }
                // A newline: handled at the top of the loop.
                Some((k, _)) => *i = k,
            },
            State::Nested {
                depth,
                in_string: true,
                escaped,
            } => {
                if escaped {
                    *i += 1;
                    self.state = State::Nested {
                        depth,
                        in_string: true,
                        escaped: false,
                    };
                    return Step::Next;
                }
                match Self::string_stop(chunk, *i) {
                    None => *i = chunk.len(),
                    Some((k, stop)) if stop != b'\n' => {
                        *i = k + 1;
                        self.state = State::Nested {
                            depth,
                            in_string: stop == b'\\',
                            escaped: stop == b'\\',
                        };
                    }
                    Some((k, _)) => *i = k,
                }
            }
            State::Nested { depth, .. } => {
                *i += 1;
                self.state = match b {
                    b'"' => State::Nested {
                        depth,
                        in_string: true,
                        escaped: false,
                    },
                    b'{' | b'[' => State::Nested {
                        depth: depth.saturating_add(1),
                        in_string: false,
                        escaped: false,
                    },
                    b'}' | b']' if depth <= 1 => State::AfterValue,
                    b'}' | b']' => State::Nested {
                        depth: depth - 1,
                        in_string: false,
                        escaped: false,
                    },
                    _ => self.state,
                };
            }
            State::Scalar => {
                if is_ws(b) || matches!(b, b',' | b'}' | b']') {
                    self.state = State::AfterValue;
                } else {
                    *i += 1;
                }
            }
            _ => {}
        }
        Step::Next
    }
}
