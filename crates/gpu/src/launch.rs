//! Typed kernel launchers: one Rust function per `extern "C" __global__` kernel of
//! `kernels/*.cu`, declared with [`kernel_launchers!`](crate::kernel_launchers), so that a
//! launch site cannot pass the wrong number of arguments, an `int` where the kernel takes a
//! pointer, or a value that does not fit the kernel's integer type (each integer is converted
//! with `try_into`, and a value that does not fit is an error naming the kernel, the parameter
//! and the value: no silent `as` truncation).
//!
//! The declared parameter lists are checked against the kernel sources by
//! `tests/it/kernel_abi.rs`: the names and C types of each kernel's parameters in `kernels/*.cu`
//! (always), and the `.param` list of the PTX NVRTC makes (when libnvrtc is present), so that a
//! launcher whose two `int` parameters are swapped fails the test. See docs/architecture.md,
//! "GPU layer".
//!
//! `unsafe` stays inside the launchers the macro generates:
//! [`Module::launch_raw`](super::Module::launch_raw) is an `unsafe fn`, and only those
//! launchers call it.

use std::fmt::Debug;
use std::marker::PhantomData;

use super::context::{DevBuf, KArg};
use crate::GpuError;

/// A device element type: its canonical C type name as `kernels/*.cu` spells it after
/// [`canonical_c_type`].
pub trait Elem {
    /// The canonical C type (`"uint16_t"`, `"__nv_bfloat16"`, `"float"`, …).
    const C_TYPE: &'static str;
}

macro_rules! elem {
    ($($t:ty => $c:literal),* $(,)?) => { $(impl Elem for $t { const C_TYPE: &'static str = $c; })* };
}

/// `__nv_bfloat16` (BF16 stored as 2 bytes).
#[derive(Debug, Clone, Copy)]
pub struct Bf16;
/// CUDA's `uint4` (16 bytes: four `unsigned`).
#[derive(Debug, Clone, Copy)]
pub struct U32x4;
/// CUDA's `int4` (16 bytes: four `int`).
#[derive(Debug, Clone, Copy)]
pub struct I32x4;
/// `void` (untyped memory, e.g. a KV cache whose element type a flag selects).
#[derive(Debug, Clone, Copy)]
pub struct Void;

elem! {
    u8 => "uint8_t",
    u16 => "uint16_t",
    i32 => "int",
    u32 => "unsigned",
    u64 => "unsigned long long",
    f32 => "float",
    Bf16 => "__nv_bfloat16",
    U32x4 => "uint4",
    I32x4 => "int4",
    Void => "void",
}

/// The canonical spelling of a C scalar type of a kernel parameter or pointee: `uint32_t` and
/// `unsigned int` → `unsigned`, `uint64_t` → `unsigned long long`, `int32_t` → `int`; other
/// names unchanged.
pub fn canonical_c_type(c: &str) -> &str {
    match c {
        "uint32_t" | "unsigned int" => "unsigned",
        "uint64_t" | "unsigned long long int" => "unsigned long long",
        "int32_t" | "signed int" => "int",
        other => other,
    }
}

/// A device address of elements of type `T` (a pointer argument of a kernel). It carries no
/// length: the kernels take their sizes as separate parameters.
pub struct DevPtr<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}
impl<T> Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr({:#x})", self.addr)
    }
}

impl<T> DevPtr<T> {
    /// The address `addr` (a device pointer from [`DevBuf::ptr`] plus a byte offset) as a
    /// pointer to `T`.
    pub fn at(addr: u64) -> Self {
        Self {
            addr,
            _elem: PhantomData,
        }
    }
    /// The null pointer (for kernels that take an optional buffer).
    pub fn null() -> Self {
        Self::at(0)
    }
    /// The device address.
    pub fn addr(self) -> u64 {
        self.addr
    }
}

/// The ABI class of one kernel parameter: what `kernels/*.cu` declares and what the PTX
/// `.param` carries (pointers and `unsigned long long` are `.u64`, `int` and `unsigned` are
/// `.u32`, `float` is `.f32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// A pointer to elements of this canonical C type.
    Ptr(&'static str),
    /// `int`.
    I32,
    /// `unsigned` / `uint32_t`.
    U32,
    /// `unsigned long long` / `uint64_t`.
    U64,
    /// `float`.
    F32,
}

impl Abi {
    /// The PTX `.param` type of this class (`.u64`, `.u32`, `.f32`).
    pub fn ptx_type(self) -> &'static str {
        match self {
            Abi::Ptr(_) | Abi::U64 => ".u64",
            Abi::I32 | Abi::U32 => ".u32",
            Abi::F32 => ".f32",
        }
    }
}

/// A type a launcher declares for a kernel parameter.
pub trait KernelArg: Copy {
    /// Its ABI class.
    const ABI: Abi;
    /// The raw argument pushed to the launch.
    fn karg(self) -> KArg;
}

impl KernelArg for i32 {
    const ABI: Abi = Abi::I32;
    fn karg(self) -> KArg {
        KArg::I32(self)
    }
}
impl KernelArg for u32 {
    const ABI: Abi = Abi::U32;
    fn karg(self) -> KArg {
        KArg::U32(self)
    }
}
impl KernelArg for u64 {
    const ABI: Abi = Abi::U64;
    fn karg(self) -> KArg {
        KArg::U64(self)
    }
}
impl KernelArg for f32 {
    const ABI: Abi = Abi::F32;
    fn karg(self) -> KArg {
        KArg::F32(self)
    }
}
impl<T: Elem> KernelArg for DevPtr<T> {
    const ABI: Abi = Abi::Ptr(T::C_TYPE);
    fn karg(self) -> KArg {
        KArg::Ptr(self.addr)
    }
}

/// What a launch site may pass for a parameter of type `A`: any integer that converts to the
/// kernel's integer type without loss (checked), an `f32`, a [`DevPtr<T>`] or a whole
/// [`DevBuf`] (its start, as the element type the launcher declares).
pub trait IntoArg<A> {
    /// Convert, or an error naming `kernel`, `param` and the value.
    ///
    /// # Errors
    /// The value does not fit in `A`.
    fn into_arg(self, kernel: &str, param: &str) -> Result<A, GpuError>;
}

fn does_not_fit(kernel: &str, param: &str, value: &dyn Debug, ty: &str) -> GpuError {
    GpuError::Usage {
        context: format!("launching {kernel}"),
        message: format!("argument {param} = {value:?} does not fit the kernel's {ty} parameter"),
    }
}

macro_rules! int_arg {
    ($($t:ty => $c:literal),*) => {$(
        impl<X: TryInto<$t> + Copy + Debug> IntoArg<$t> for X {
            fn into_arg(self, kernel: &str, param: &str) -> Result<$t, GpuError> {
                self.try_into().map_err(|_| does_not_fit(kernel, param, &self, $c))
            }
        }
    )*};
}
int_arg!(i32 => "int", u32 => "unsigned", u64 => "unsigned long long");

impl IntoArg<f32> for f32 {
    fn into_arg(self, _: &str, _: &str) -> Result<f32, GpuError> {
        Ok(self)
    }
}
impl<T> IntoArg<DevPtr<T>> for DevPtr<T> {
    fn into_arg(self, _: &str, _: &str) -> Result<DevPtr<T>, GpuError> {
        Ok(self)
    }
}
impl<T> IntoArg<DevPtr<T>> for &DevBuf {
    fn into_arg(self, _: &str, _: &str) -> Result<DevPtr<T>, GpuError> {
        Ok(DevPtr::at(self.ptr()))
    }
}
impl<T> IntoArg<DevPtr<T>> for &&DevBuf {
    fn into_arg(self, _: &str, _: &str) -> Result<DevPtr<T>, GpuError> {
        Ok(DevPtr::at(self.ptr()))
    }
}

/// One declared parameter of a launcher.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its name as the launcher spells it (the kernel's name, lower-cased).
    pub name: &'static str,
    /// Its ABI class.
    pub abi: Abi,
}

/// A launcher's declaration: which file, which kernel, which parameters in order.
#[derive(Debug, Clone, Copy)]
pub struct KernelSig {
    /// The source file stem under `kernels/` (`"runtime"` for `kernels/runtime.cu`).
    pub source: &'static str,
    /// The kernel name, or a family of names with `*` standing for `[A-Za-z0-9_]+` (kernels
    /// stamped out by a macro, e.g. `fp8_quant_rows_bf16_t*_v*`).
    pub name: &'static str,
    /// The parameters in order.
    pub params: &'static [Param],
}

/// Whether kernel `name` belongs to `pattern` (`*` matches one or more of `[A-Za-z0-9_]`).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (1..=n.len())
                .take_while(|&i| n[i - 1].is_ascii_alphanumeric() || n[i - 1] == b'_')
                .any(|i| go(rest, &n[i..])),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Check that `name` is in the family `pattern` a launcher was declared for.
///
/// # Errors
/// It is not.
pub fn check_family(pattern: &str, name: &str) -> Result<(), GpuError> {
    if name_matches(pattern, name) {
        Ok(())
    } else {
        Err(GpuError::Usage {
            context: format!("launching {name}"),
            message: format!("kernel {name} is not of the launcher's family {pattern}"),
        })
    }
}

/// A grid or block extent as `u32`, checked.
///
/// # Errors
/// `v` does not fit in `u32` (the error names `what` and the value).
pub fn dim<X: TryInto<u32> + Copy + Debug>(what: &str, v: X) -> Result<u32, GpuError> {
    v.try_into().map_err(|_| GpuError::Usage {
        context: "kernel launch shape".into(),
        message: format!("{what} = {v:?} does not fit a CUDA grid or block dimension (u32)"),
    })
}

/// Declare the typed launchers of one `kernels/*.cu` file and its `SIGNATURES` list (read by
/// `tests/it/kernel_abi.rs`).
///
/// ```ignore
/// kernel_launchers! {
///     source "util";
///     /// Fill `out` with BF16 uniform in [-scale, scale].
///     pub fn fill_uniform_bf16 = "fill_uniform_bf16"(out: DevPtr<Bf16>, n: u64, seed: u32, scale: f32);
///     /// A family stamped out by a macro; the launcher takes the concrete name.
///     pub fn fq_rows = family "fp8_quant_rows_bf16_t*_v*"(input: DevPtr<u16>, m: i32, k: i32, ...);
/// }
/// ```
///
/// Each launcher is `fn(module, gpu, grid, block, shared_bytes, args…) -> Result<(), GpuError>`
/// (a family launcher takes the kernel name after `gpu`); each argument is
/// `impl IntoArg<declared type>`.
#[macro_export]
macro_rules! kernel_launchers {
    (source $src:literal; $( $(#[$doc:meta])* $vis:vis fn $fname:ident = $($fam:ident)? $kname:literal ( $( $p:ident : $t:ty ),* $(,)? ); )* ) => {
        /// The launchers' declarations, in the order of this file (checked against the kernel
        /// sources by `tests/it/kernel_abi.rs`).
        pub const SIGNATURES: &[$crate::launch::KernelSig] = &[ $(
            $crate::launch::KernelSig {
                source: $src,
                name: $kname,
                params: &[ $( $crate::launch::Param {
                    name: stringify!($p),
                    abi: <$t as $crate::launch::KernelArg>::ABI,
                } ),* ],
            }
        ),* ];
        $( $crate::kernel_launchers!(@one [$($fam)?] $(#[$doc])* $vis fn $fname = $kname ( $( $p : $t ),* )); )*
    };
    (@one [] $(#[$doc:meta])* $vis:vis fn $fname:ident = $kname:literal ( $( $p:ident : $t:ty ),* )) => {
        $(#[$doc])*
        ///
        /// # Errors
        /// An argument that does not fit its parameter's type, an unknown kernel, or a launch
        /// failure.
        #[allow(clippy::too_many_arguments, dead_code)]
        $vis fn $fname(
            module: &$crate::Module,
            gpu: &$crate::Gpu,
            grid: (u32, u32, u32),
            block: (u32, u32, u32),
            shared_bytes: u32,
            $( $p: impl $crate::launch::IntoArg<$t> ),*
        ) -> Result<(), $crate::GpuError> {
            let args = [ $( $crate::launch::KernelArg::karg(
                $crate::launch::IntoArg::<$t>::into_arg($p, $kname, stringify!($p))?
            ) ),* ];
            // SAFETY: the argument list has the kernel's parameter types in its order, as
            // declared above and checked against kernels/*.cu (and the PTX) by
            // tests/it/kernel_abi.rs; pointers come from live device buffers the caller owns.
            unsafe { module.launch_raw(gpu, $kname, grid, block, shared_bytes, &args) }
        }
    };
    (@one [family] $(#[$doc:meta])* $vis:vis fn $fname:ident = $kname:literal ( $( $p:ident : $t:ty ),* )) => {
        $(#[$doc])*
        ///
        /// `kernel` is the concrete name, of the family in this launcher's declaration.
        ///
        /// # Errors
        /// A kernel name outside the family, an argument that does not fit its parameter's
        /// type, an unknown kernel, or a launch failure.
        #[allow(clippy::too_many_arguments, dead_code)]
        $vis fn $fname(
            module: &$crate::Module,
            gpu: &$crate::Gpu,
            kernel: &str,
            grid: (u32, u32, u32),
            block: (u32, u32, u32),
            shared_bytes: u32,
            $( $p: impl $crate::launch::IntoArg<$t> ),*
        ) -> Result<(), $crate::GpuError> {
            $crate::launch::check_family($kname, kernel)?;
            let args = [ $( $crate::launch::KernelArg::karg(
                $crate::launch::IntoArg::<$t>::into_arg($p, kernel, stringify!($p))?
            ) ),* ];
            // SAFETY: as for the single-kernel launchers: every kernel of the family has the
            // declared parameter list (tests/it/kernel_abi.rs checks each one).
            unsafe { module.launch_raw(gpu, kernel, grid, block, shared_bytes, &args) }
        }
    };
}

/// One parameter of a kernel as its CUDA source declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceParam {
    /// Its name.
    pub name: String,
    /// Its C type ([`canonical_c_type`]; the pointee for a pointer), `const` and
    /// `__restrict__` left out.
    pub c_type: String,
    /// Whether it is a pointer.
    pub pointer: bool,
}

/// One `extern "C" __global__` kernel of a CUDA source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceKernel {
    /// Its name (macro-stamped names expanded).
    pub name: String,
    /// Its parameters in order.
    pub params: Vec<SourceParam>,
}

fn strip_c_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' && i + 1 < b.len() {
                out.push_str(&src[i..i + 2]);
                i += 2;
                continue;
            }
            in_str = b[i] != b'"';
        } else if b[i] == b'"' {
            in_str = true;
        } else if src[i..].starts_with("//") {
            i = src[i..].find('\n').map_or(b.len(), |n| i + n);
            continue;
        } else if src[i..].starts_with("/*") {
            i = src[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
            out.push(' ');
            continue;
        }
        let ch = src[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Substitute macro parameters by arguments (whole identifiers) and apply `##` pasting.
fn expand_macro(body: &str, params: &[String], args: &[String]) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if let Some(i) = params.iter().position(|p| p == word) {
            out.push_str(args.get(i).map_or("", |a| a.as_str()));
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in body.chars() {
        if is_ident(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    let mut pasted = String::new();
    for (i, part) in out.split("##").enumerate() {
        if i == 0 {
            pasted.push_str(part.trim_end());
        } else {
            pasted.push_str(part.trim());
        }
    }
    pasted
}

/// Split `s` at top-level commas (parentheses nest).
fn split_commas(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The text from `open` (just past a `(`) to its matching `)`, and the index past it.
fn balanced(s: &str, open: usize) -> Option<(&str, usize)> {
    let mut depth = 1;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&s[open..open + i], open + i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// Most nested macro expansions [`parse_cuda_kernels`] follows.
pub const MAX_MACRO_DEPTH: usize = 8;

/// Whether `body` invokes the function-like macro `name` (the identifier followed by `(`).
fn invokes(body: &str, name: &str) -> bool {
    let mut at = 0;
    while let Some(i) = body[at..].find(name) {
        let start = at + i;
        let end = start + name.len();
        at = end;
        let before_ok = body[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !is_ident(c));
        let after = &body[end..];
        if before_ok && !after.starts_with(is_ident) && after.trim_start().starts_with('(') {
            return true;
        }
    }
    false
}

/// `text` with every invocation of one of `macros` replaced by its expansion, expanded again
/// (up to [`MAX_MACRO_DEPTH`] levels; deeper invocations are left as written).
fn expand_invocations(
    text: &str,
    macros: &[(String, Vec<String>, String)],
    depth: usize,
) -> String {
    if depth >= MAX_MACRO_DEPTH {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| is_ident(c)) {
        out.push_str(&rest[..i]);
        let word_len = rest[i..]
            .find(|c: char| !is_ident(c))
            .unwrap_or(rest.len() - i);
        let word = &rest[i..i + word_len];
        let after = &rest[i + word_len..];
        let call = macros.iter().find(|m| m.0 == word).and_then(|m| {
            let args = after.trim_start().strip_prefix('(')?;
            let (a, end) = balanced(args, 0)?;
            let consumed = after.len() - args.len() + end;
            Some((expand_macro(&m.2, &m.1, &split_commas(a)), consumed))
        });
        match call {
            Some((body, consumed)) => {
                out.push_str(&expand_invocations(&body, macros, depth + 1));
                out.push('\n');
                rest = &after[consumed..];
            }
            None => {
                out.push_str(word);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every `extern "C" __global__` kernel of a CUDA source with its parameters, the kernels a
/// function-like `#define` stamps out expanded at each of its invocations (so
/// `FQ_VARIANT(256, 4)` yields `fp8_quant_rows_bf16_t256_v4`), through macros that invoke
/// such macros too (`MOE_GEMV_VARIANT(4, 4)` → `MOE_GEMV_KERNELS(4, 4, _t8, true)` → …, up to
/// [`MAX_MACRO_DEPTH`] levels). Host text parsing, no compiler.
///
/// # Errors
/// A parameter declaration that cannot be read (the message names the kernel and the text).
pub fn parse_cuda_kernels(src: &str) -> Result<Vec<SourceKernel>, String> {
    let text = strip_c_comments(src)
        .replace("\\\r\n", " ")
        .replace("\\\n", " ");
    // Function-like macros, and the rest of the text.
    let mut macros: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut plain = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#define") {
            let rest = rest.trim_start();
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() && rest[name.len()..].starts_with('(') {
                if let Some((ps, end)) = balanced(rest, name.len() + 1) {
                    macros.push((name, split_commas(ps), rest[end..].to_string()));
                }
            }
            continue;
        }
        if t.starts_with('#') {
            continue;
        }
        plain.push_str(line);
        plain.push('\n');
    }
    // Only the macros that stamp out kernels: a body with `__global__`, or (to a fixed point)
    // one invoking such a macro.
    let mut stamps: Vec<bool> = macros.iter().map(|m| m.2.contains("__global__")).collect();
    loop {
        let mut changed = false;
        for i in 0..macros.len() {
            if !stamps[i]
                && (0..macros.len()).any(|j| stamps[j] && invokes(&macros[i].2, &macros[j].0))
            {
                stamps[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let macros: Vec<_> = macros
        .into_iter()
        .zip(stamps)
        .filter_map(|(m, s)| s.then_some(m))
        .collect();
    let expanded = expand_invocations(&plain, &macros, 0);
    let mut out = Vec::new();
    let key = "__global__";
    let mut at = 0;
    while let Some(i) = expanded[at..].find(key) {
        let start = at + i + key.len();
        at = start;
        let before = expanded[..at - key.len()].trim_end();
        if !before.ends_with("extern \"C\"") {
            continue;
        }
        let mut rest = expanded[start..].trim_start();
        rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
        if let Some(r) = rest.strip_prefix("__launch_bounds__") {
            let r = r.trim_start();
            let Some((_, end)) = r.strip_prefix('(').and_then(|r| balanced(r, 0)) else {
                return Err(format!(
                    "unreadable __launch_bounds__ near: {}",
                    &r[..r.len().min(60)]
                ));
            };
            rest = r[1 + end..].trim_start();
        }
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        let after = rest[name.len()..].trim_start();
        let Some((plist, _)) = after.strip_prefix('(').and_then(|a| balanced(a, 0)) else {
            return Err(format!("kernel {name}: no parameter list"));
        };
        let mut params = Vec::new();
        for p in split_commas(plist) {
            let pointer = p.contains('*');
            let words: Vec<&str> = p
                .split(|c: char| c.is_whitespace() || c == '*')
                .filter(|w| !w.is_empty() && *w != "const" && *w != "__restrict__")
                .collect();
            let Some((pname, ty)) = words.split_last() else {
                return Err(format!("kernel {name}: unreadable parameter `{p}`"));
            };
            if ty.is_empty() {
                return Err(format!("kernel {name}: parameter `{p}` has no type"));
            }
            params.push(SourceParam {
                name: pname.to_string(),
                c_type: canonical_c_type(&ty.join(" ")).to_string(),
                pointer,
            });
        }
        out.push(SourceKernel { name, params });
    }
    Ok(out)
}

/// The `.param` types (`.u64`, `.u32`, `.f32`, …) of each `.entry` of a PTX text, by kernel.
pub fn parse_ptx_entries(ptx: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = ptx[at..].find(".entry ") {
        let start = at + i + ".entry ".len();
        let name: String = ptx[start..].chars().take_while(|&c| is_ident(c)).collect();
        let rest = &ptx[start + name.len()..];
        let end = rest.find(')').unwrap_or(rest.len());
        let types = rest[..end]
            .split(".param")
            .skip(1)
            .filter_map(|p| p.split_whitespace().next().map(str::to_string))
            .collect();
        at = start + name.len() + end;
        out.push((name, types));
    }
    out
}

/// Compare a launcher declaration with the kernel its source declares: the same number of
/// parameters, and in each position the same name (ignoring case and a `r#` prefix) and the
/// same C type (the pointee for pointers). Returns one line per difference.
pub fn compare_with_source(sig: &KernelSig, k: &SourceKernel) -> Vec<String> {
    let mut diffs = Vec::new();
    if sig.params.len() != k.params.len() {
        diffs.push(format!(
            "{}: the launcher declares {} parameters, kernels/{}.cu has {}",
            k.name,
            sig.params.len(),
            sig.source,
            k.params.len()
        ));
    }
    for (i, (d, s)) in sig.params.iter().zip(&k.params).enumerate() {
        let dname = d.name.trim_start_matches("r#");
        if !dname.eq_ignore_ascii_case(&s.name) {
            diffs.push(format!(
                "{} parameter {i}: launcher `{dname}`, source `{}`",
                k.name, s.name
            ));
        }
        let same_type = match d.abi {
            Abi::Ptr(t) => s.pointer && t == s.c_type,
            Abi::I32 => !s.pointer && s.c_type == "int",
            Abi::U32 => !s.pointer && s.c_type == "unsigned",
            Abi::U64 => !s.pointer && s.c_type == "unsigned long long",
            Abi::F32 => !s.pointer && s.c_type == "float",
        };
        if !same_type {
            diffs.push(format!(
                "{} parameter {i} `{}`: launcher {:?}, source {}{}",
                k.name,
                s.name,
                d.abi,
                s.c_type,
                if s.pointer { "*" } else { "" }
            ));
        }
    }
    diffs
}

/// Compare a launcher declaration with the `.param` types of one PTX entry. Returns one line
/// per difference.
pub fn compare_with_ptx(sig: &KernelSig, entry: &str, ptx_types: &[String]) -> Vec<String> {
    let want: Vec<&str> = sig.params.iter().map(|p| p.abi.ptx_type()).collect();
    if want == ptx_types.iter().map(String::as_str).collect::<Vec<_>>() {
        Vec::new()
    } else {
        vec![format!(
            "{entry}: launcher's PTX parameters {want:?}, NVRTC's PTX {ptx_types:?}"
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_patterns_match_their_kernels_only() {
        assert!(name_matches(
            "fp8_quant_rows_bf16_t*_v*",
            "fp8_quant_rows_bf16_t256_v4"
        ));
        assert!(!name_matches(
            "fp8_quant_rows_bf16_t*_v*",
            "rmsnorm_fp8_quant_rows_bf16_t256_v4"
        ));
        assert!(!name_matches(
            "fp8_quant_rows_bf16_t*_v*",
            "fp8_quant_rows_bf16_any"
        ));
        assert!(name_matches("w4a16_nt*_w*_n*", "w4a16_nt8_w4_n2_ks"));
        assert!(!name_matches("w4a16_nt*_w*_n*", "w4a16_dequant_bf16"));
        assert!(name_matches("rt_embed", "rt_embed"));
        assert!(!name_matches("rt_embed", "rt_embed2"));
        assert!(check_family("w4wg_t*_g*", "w4wg_t128_g2_p").is_ok());
        assert!(check_family("w4wg_t*_g*", "w4v2_nt8_w4_n2").is_err());
    }

    #[test]
    fn integer_arguments_are_checked_not_truncated() {
        let ok: i32 = IntoArg::<i32>::into_arg(4096usize, "k", "m").unwrap();
        assert_eq!(ok, 4096);
        let e = IntoArg::<i32>::into_arg(3_000_000_000usize, "rt_embed", "t").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("rt_embed") && msg.contains("t = 3000000000"),
            "{msg}"
        );
        assert!(IntoArg::<u32>::into_arg(-1i32, "k", "n").is_err());
        assert!(IntoArg::<u64>::into_arg(-1i64, "k", "n").is_err());
        assert_eq!(IntoArg::<u64>::into_arg(7u32, "k", "n").unwrap(), 7);
        assert!(dim("grid.x", 1usize << 33).is_err());
        assert_eq!(dim("grid.x", 40usize).unwrap(), 40);
    }

    const SRC: &str = r#"
// a comment with __global__ in it
#define KV_VARIANT(T, V) \
  extern "C" __global__ void __launch_bounds__(T) rows_t##T##_v##V(const uint16_t* __restrict__ in, int M, \
      int K, float* __restrict__ scales) { body<T, V>(in, M, K, scales); }
KV_VARIANT(128, 2)
KV_VARIANT(256, 4)
/* block comment */
extern "C" __global__ void plain(const __nv_bfloat16* __restrict__ x, unsigned long long n, uint32_t seed,
                                 float scale) {}
__global__ void not_extern(int a) {}
"#;

    #[test]
    fn cuda_source_kernels_are_parsed_with_macro_instances() {
        let ks = parse_cuda_kernels(SRC).unwrap();
        let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
        // In source order: the macro's instances where they are invoked, then `plain`.
        assert_eq!(names, ["rows_t128_v2", "rows_t256_v4", "plain"]);
        let p = &ks[2].params;
        assert_eq!(p.len(), 4);
        assert_eq!(
            (p[0].name.as_str(), p[0].c_type.as_str(), p[0].pointer),
            ("x", "__nv_bfloat16", true)
        );
        assert_eq!(
            (p[1].c_type.as_str(), p[1].pointer),
            ("unsigned long long", false)
        );
        assert_eq!(p[2].c_type, "unsigned");
        assert_eq!(ks[0].params[1].name, "M");
    }

    #[test]
    fn kernels_stamped_through_nested_macros_are_found() {
        // As kernels/gemv.cu stamps its grouped GEMVs: a variant macro invoking a pair macro
        // invoking the kernel macro, with an empty argument pasted onto a name.
        let src = r#"
#define ONE_KERNEL(NAME, FP8) \
  extern "C" __global__ void __launch_bounds__(128) NAME(const float* __restrict__ x, int n) { \
    body<FP8>(x, n); }
#define PAIR(W, SUFFIX) \
  ONE_KERNEL(g_bf16_w##W##SUFFIX, false) \
  ONE_KERNEL(g_fp8_w##W##SUFFIX, true)
#define VARIANT(W) \
  PAIR(W, ) \
  PAIR(W, _t8)
VARIANT(4)
#define NOT_A_KERNEL(a) ((a) + 1)
extern "C" __global__ void after(int v) { int z = NOT_A_KERNEL(v); }
"#;
        let ks = parse_cuda_kernels(src).unwrap();
        let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "g_bf16_w4",
                "g_fp8_w4",
                "g_bf16_w4_t8",
                "g_fp8_w4_t8",
                "after"
            ]
        );
        assert!(ks[..4]
            .iter()
            .all(|k| k.params.len() == 2 && k.params[0].pointer));
    }

    const ROWS: KernelSig = KernelSig {
        source: "x",
        name: "rows_t*_v*",
        params: &[
            Param {
                name: "r#in",
                abi: Abi::Ptr("uint16_t"),
            },
            Param {
                name: "m",
                abi: Abi::I32,
            },
            Param {
                name: "k",
                abi: Abi::I32,
            },
            Param {
                name: "scales",
                abi: Abi::Ptr("float"),
            },
        ],
    };

    #[test]
    fn a_launcher_with_two_int_parameters_swapped_is_caught() {
        let ks = parse_cuda_kernels(SRC).unwrap();
        assert!(
            compare_with_source(&ROWS, &ks[0]).is_empty(),
            "{:?}",
            compare_with_source(&ROWS, &ks[0])
        );
        let swapped = KernelSig {
            params: &[
                Param {
                    name: "r#in",
                    abi: Abi::Ptr("uint16_t"),
                },
                Param {
                    name: "k",
                    abi: Abi::I32,
                },
                Param {
                    name: "m",
                    abi: Abi::I32,
                },
                Param {
                    name: "scales",
                    abi: Abi::Ptr("float"),
                },
            ],
            ..ROWS
        };
        assert_eq!(compare_with_source(&swapped, &ks[0]).len(), 2);
        let wrong_type = KernelSig {
            params: &[
                Param {
                    name: "r#in",
                    abi: Abi::Ptr("__nv_bfloat16"),
                },
                Param {
                    name: "m",
                    abi: Abi::U32,
                },
                Param {
                    name: "k",
                    abi: Abi::I32,
                },
                Param {
                    name: "scales",
                    abi: Abi::Ptr("float"),
                },
            ],
            ..ROWS
        };
        assert_eq!(compare_with_source(&wrong_type, &ks[0]).len(), 2);
        let short = KernelSig {
            params: &ROWS.params[..3],
            ..ROWS
        };
        assert!(!compare_with_source(&short, &ks[0]).is_empty());
    }

    #[test]
    fn ptx_entries_are_read_and_compared() {
        let ptx = ".visible .entry rows_t128_v2(\n\t.param .u64 rows_t128_v2_param_0,\n\t.param .u32 rows_t128_v2_param_1,\n\t.param .u32 rows_t128_v2_param_2,\n\t.param .u64 rows_t128_v2_param_3\n)\n{\n}\n.visible .entry e(\n)\n{}";
        let e = parse_ptx_entries(ptx);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0, "rows_t128_v2");
        assert_eq!(e[0].1, [".u64", ".u32", ".u32", ".u64"]);
        assert!(e[1].1.is_empty());
        assert!(compare_with_ptx(&ROWS, &e[0].0, &e[0].1).is_empty());
        const F_FIRST: &[Param] = &[
            Param {
                name: "in",
                abi: Abi::F32,
            },
            Param {
                name: "m",
                abi: Abi::I32,
            },
            Param {
                name: "k",
                abi: Abi::I32,
            },
            Param {
                name: "scales",
                abi: Abi::Ptr("float"),
            },
        ];
        let f = KernelSig {
            params: F_FIRST,
            ..ROWS
        };
        assert_eq!(compare_with_ptx(&f, &e[0].0, &e[0].1).len(), 1);
    }

    #[test]
    fn abi_classes_map_to_ptx_param_types() {
        assert_eq!(<DevPtr<Bf16> as KernelArg>::ABI, Abi::Ptr("__nv_bfloat16"));
        assert_eq!(<DevPtr<Bf16> as KernelArg>::ABI.ptx_type(), ".u64");
        assert_eq!(<i32 as KernelArg>::ABI.ptx_type(), ".u32");
        assert_eq!(<u32 as KernelArg>::ABI.ptx_type(), ".u32");
        assert_eq!(<f32 as KernelArg>::ABI.ptx_type(), ".f32");
        assert_eq!(canonical_c_type("uint32_t"), "unsigned");
        assert_eq!(canonical_c_type("uint64_t"), "unsigned long long");
    }
}
