//! The parts of an OpenAI-style request body that routing needs, read in one
//! pass. Unknown fields are skipped (`IgnoredAny`), never rejected or built.
//!
//! Memory stays a small multiple of the body however hostile its shape: the
//! prompt is turned into its canonical text while it is read (no list of
//! messages or parts is kept), strings are borrowed from the body where they
//! have no escapes, and nothing is buffered to guess a variant (serde's
//! untagged enums would copy a whole value, e.g. an array of a million
//! numbers, into a generic tree first).

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};

use super::prefix::{ITEM_END, ROLE_END};

#[derive(Debug, Default, Deserialize)]
pub struct Request<'a> {
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
    pub messages: Option<Messages>,
    #[serde(borrow)]
    pub prompt: Option<Prompt<'a>>,
    #[serde(borrow)]
    pub prompt_cache_key: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub user: Option<Cow<'a, str>>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub stream: Option<bool>,
}

/// Chat messages in canonical form: for each message its role, `ROLE_END`, its
/// content (text parts one per line, a non-text part by its type), `ITEM_END`.
/// A conversation's next turn extends the previous turn's text.
#[derive(Debug, Default)]
pub struct Messages {
    pub text: Vec<u8>,
    /// Where the first system and the first user message are in `text`.
    pub first_system: Option<Range<usize>>,
    pub first_user: Option<Range<usize>>,
    /// A reply (an `assistant` or `tool` message) is among them: the chat
    /// continues a conversation.
    pub answered: bool,
}

/// One message as it is read; appended to [`Messages`] at once.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
}

/// A message's content: a string, or typed parts already in canonical form.
enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<u8>),
}

impl Content<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Content::Text(t) => t.as_bytes(),
            Content::Parts(p) => p,
        }
    }
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// A completions prompt in canonical form: a string as is, an array of strings
/// each followed by `ITEM_END`.
#[derive(Debug)]
pub struct Prompt<'a>(pub Cow<'a, [u8]>);

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Messages, A::Error> {
                let mut out = Messages::default();
                while let Some(m) = seq.next_element::<Message<'de>>()? {
                    let start = out.text.len();
                    let content = m.content.as_ref().map_or(&[][..], Content::bytes);
                    // One growth per message at most: a large message is not
                    // copied again by the pushes after it.
                    out.text.reserve(m.role.len() + content.len() + 2);
                    out.text.extend_from_slice(m.role.as_bytes());
                    out.text.push(ROLE_END);
                    out.text.extend_from_slice(content);
                    out.text.push(ITEM_END);
                    let slot = match &*m.role {
                        "system" => &mut out.first_system,
                        "user" => &mut out.first_user,
                        "assistant" | "tool" => {
                            out.answered = true;
                            continue;
                        }
                        _ => continue,
                    };
                    slot.get_or_insert(start..out.text.len());
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content<'de>, E> {
                Ok(Content::Text(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(p) = seq.next_element::<Part<'de>>()? {
                    // A non-text part still marks its place in the prompt.
                    out.extend_from_slice(p.text.as_deref().unwrap_or(&p.kind).as_bytes());
                    out.push(b'\n');
                }
                Ok(Content::Parts(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prompt<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Prompt<'de>, E> {
                Ok(Prompt(Cow::Borrowed(s.as_bytes())))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Prompt<'de>, E> {
                Ok(Prompt(Cow::Owned(s.as_bytes().to_vec())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Prompt<'de>, E> {
                Ok(Prompt(Cow::Owned(s.into_bytes())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(Text(t)) = seq.next_element::<Text<'de>>()? {
                    out.extend_from_slice(t.as_bytes());
                    out.push(ITEM_END);
                }
                Ok(Prompt(Cow::Owned(out)))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string borrowed from the body unless it has escapes (a bare `Cow` in a
/// list would always be copied).
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The top-level fields of a body whose fields have the wrong shape: each
/// taken whatever its type, so a field given twice is found even after a
/// value of the wrong type; the model kept when it is a string.
#[derive(Debug, Deserialize)]
#[expect(
    dead_code,
    reason = "the other fields are there for serde to find a field given twice"
)]
pub struct TopLevel<'a> {
    #[serde(borrow)]
    pub model: Option<AnyText<'a>>,
    messages: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    prompt_cache_key: Option<IgnoredAny>,
    user: Option<IgnoredAny>,
    max_tokens: Option<IgnoredAny>,
    max_completion_tokens: Option<IgnoredAny>,
    stream: Option<IgnoredAny>,
}

/// A value that is text or anything else (`None`).
#[derive(Debug)]
pub struct AnyText<'a>(pub Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for AnyText<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<AnyText<'de>, E> {
                Ok(AnyText(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<AnyText<'de>, E> {
                Ok(AnyText(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<AnyText<'de>, E> {
                Ok(AnyText(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<AnyText<'de>, E> {
                Ok(AnyText(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<AnyText<'de>, E> {
                Ok(AnyText(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<AnyText<'de>, E> {
                Ok(AnyText(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<AnyText<'de>, E> {
                Ok(AnyText(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AnyText<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(AnyText(None))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<AnyText<'de>, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(AnyText(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Any JSON value, read strictly and kept nowhere: every number parsed
/// (`1E400` is out of range), every string unescaped (a lone surrogate is
/// no text), unlike `IgnoredAny`, which skips both unchecked.
pub struct Strict;

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        while seq.next_element::<Strict>()?.is_some() {}
        Ok(Strict)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        while map.next_key::<Strict>()?.is_some() {
            map.next_value::<Strict>()?;
        }
        Ok(Strict)
    }
}
