//! The part of librados' and librbd's C API the device uses, loaded at run
//! time with dlopen: the crate builds, and runs with every other device, on
//! machines without Ceph's libraries; only opening an `rbd://` origin needs
//! them (Debian: librbd1, which brings librados2).
//!
//! The libraries are loaded once per process and never unloaded (librados
//! starts threads that must not outlive their code).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

pub type RadosT = *mut c_void;
pub type IoctxT = *mut c_void;
pub type ImageT = *mut c_void;
pub type CompletionT = *mut c_void;
/// `rbd_callback_t`: called once, on one of librbd's threads, when the
/// request of the completion is over.
pub type Callback = unsafe extern "C" fn(CompletionT, *mut c_void);

/// The library names the Debian packages install (sonames).
pub const LIBRADOS: &str = "librados.so.2";
pub const LIBRBD: &str = "librbd.so.1";

/// Function pointers into librados and librbd, named as in
/// rados/librados.h and rbd/librbd.h.
pub struct Api {
    pub rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    pub rados_conf_get: unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(RadosT),
    pub rados_cluster_fsid: unsafe extern "C" fn(RadosT, *mut c_char, usize) -> c_int,
    pub rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    pub rados_ioctx_get_id: unsafe extern "C" fn(IoctxT) -> i64,
    pub rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    pub rbd_get_id: unsafe extern "C" fn(ImageT, *mut c_char, usize) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Callback, *mut CompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(CompletionT),
    pub rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    pub rbd_aio_write:
        unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
}

/// The API of the system's librbd, loaded on first use; the error says
/// which library is missing and which package has it.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| Api::load(LIBRADOS, LIBRBD))
        .as_ref()
        .map_err(Clone::clone)
}

/// A library handle from dlopen; never closed.
struct Library(*mut c_void);

impl Library {
    fn open(name: &str) -> Result<Library, String> {
        let cname = CString::new(name).map_err(|_| format!("library name '{name}' has a NUL"))?;
        // SAFETY: dlopen with a valid C string; the handle is kept for the
        // life of the process (never dlclose'd).
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "cannot load {name} ({}): install Ceph's client libraries \
                 (Debian: apt-get install librbd1)",
                dlerror()
            ));
        }
        Ok(Library(handle))
    }

    /// The address of `symbol` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be the `extern "C" fn` type of the symbol's C declaration.
    unsafe fn get<F: Copy>(&self, lib: &str, symbol: &str) -> Result<F, String> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "{symbol}: F must be a function pointer"
        );
        let csym = CString::new(symbol).expect("symbol names have no NUL");
        // SAFETY: a live handle from dlopen and a valid C string.
        let p = unsafe { libc::dlsym(self.0, csym.as_ptr()) };
        if p.is_null() {
            return Err(format!("{lib} has no symbol {symbol} ({})", dlerror()));
        }
        // SAFETY: p is the non-null address of `symbol`, whose C type the
        // caller vouches is F (a function pointer, the size checked above).
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until
    // the next dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "no reason given".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Api {
    /// Loads `librados` and `librbd` (sonames or paths) and resolves every
    /// function.
    pub fn load(librados: &str, librbd: &str) -> Result<Api, String> {
        let rados = Library::open(librados)?;
        let rbd = Library::open(librbd)?;
        // SAFETY (every `get` below): each type is the function's C
        // declaration in rados/librados.h or rbd/librbd.h of Ceph 16
        // (rados_t, rados_ioctx_t and rbd_image_t are opaque pointers;
        // size_t is usize and ssize_t isize on Linux).
        unsafe {
            Ok(Api {
                rados_create: rados.get(librados, "rados_create")?,
                rados_conf_read_file: rados.get(librados, "rados_conf_read_file")?,
                rados_conf_parse_env: rados.get(librados, "rados_conf_parse_env")?,
                rados_conf_set: rados.get(librados, "rados_conf_set")?,
                rados_conf_get: rados.get(librados, "rados_conf_get")?,
                rados_connect: rados.get(librados, "rados_connect")?,
                rados_shutdown: rados.get(librados, "rados_shutdown")?,
                rados_cluster_fsid: rados.get(librados, "rados_cluster_fsid")?,
                rados_ioctx_create: rados.get(librados, "rados_ioctx_create")?,
                rados_ioctx_destroy: rados.get(librados, "rados_ioctx_destroy")?,
                rados_ioctx_get_id: rados.get(librados, "rados_ioctx_get_id")?,
                rbd_open: rbd.get(librbd, "rbd_open")?,
                rbd_close: rbd.get(librbd, "rbd_close")?,
                rbd_get_size: rbd.get(librbd, "rbd_get_size")?,
                rbd_get_id: rbd.get(librbd, "rbd_get_id")?,
                rbd_aio_create_completion: rbd.get(librbd, "rbd_aio_create_completion")?,
                rbd_aio_get_return_value: rbd.get(librbd, "rbd_aio_get_return_value")?,
                rbd_aio_release: rbd.get(librbd, "rbd_aio_release")?,
                rbd_aio_read: rbd.get(librbd, "rbd_aio_read")?,
                rbd_aio_write: rbd.get(librbd, "rbd_aio_write")?,
                rbd_aio_discard: rbd.get(librbd, "rbd_aio_discard")?,
                rbd_aio_flush: rbd.get(librbd, "rbd_aio_flush")?,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_the_package() {
        let err = Api::load("librados-tiercache-missing.so.2", LIBRBD)
            .err()
            .unwrap();
        assert!(
            err.contains("cannot load librados-tiercache-missing.so.2")
                && err.contains("apt-get install librbd1"),
            "{err}"
        );
    }
}
