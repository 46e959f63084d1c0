//! libu3m.so: the LD_PRELOAD interposer. Thin FFI shells (hooks) over the
//! engine in `u3m-core`.

pub use u3m_core::VERSION;
