//! libu3m.so: the LD_PRELOAD interposer. Thin FFI shells (`hooks/`) decode C
//! arguments and tell the engine (in `u3m-core`, plain Rust with no exports)
//! what was allocated and touched; `dl` overrides dlsym/dlvsym so lookups
//! through library handles end at the same hooks.

#![cfg_attr(test, allow(dead_code))]

mod api;
mod dl;
mod elf;
mod ffi;
mod guard;
pub mod hooks;
pub mod init;
mod real;
mod runtime;
mod torch_hints;
mod torch_layout;

pub use u3m_core::VERSION;
