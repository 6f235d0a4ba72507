//! fleetroute's Envoy filter: reads an OpenAI-style request body once and writes
//! the route headers ext-proc decides on. Everything but `host` is plain Rust,
//! tested natively (`headers` through a fake host); `contract` is shared with ext-proc.
//!
//! A panic or a failed allocation inside Envoy's Wasm VM traps and kills the VM
//! for every request of the worker, so code outside tests may not panic: no
//! unwrap, expect, panic, unchecked indexing or slicing.
#![deny(clippy::too_many_lines)] // a function reads on one screen
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::string_slice,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::get_unwrap,
        clippy::unwrap_in_result,
        clippy::panic_in_result_fn,
        clippy::exit,
    )
)]

pub mod body;
pub mod config;
pub mod contract;
pub mod extract;
pub mod headers;
pub mod http;
pub mod rename;
pub mod response;

#[cfg(target_arch = "wasm32")]
mod host;
#[cfg(target_arch = "wasm32")]
mod host_rename;
#[cfg(target_arch = "wasm32")]
mod host_upstream;
