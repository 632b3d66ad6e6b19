//! The checked-in C header `include/memo.h` is what cbindgen generates from the crate now.
//! `MEMO_BLESS=1 cargo test -p memo-capi --test header` rewrites it after a change to the ABI.

use std::path::Path;

#[test]
fn the_checked_in_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml reads");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("include/memo.h");
    if std::env::var_os("MEMO_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("include/memo.h writes");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| committed.lines().count().min(generated.lines().count()) + 1, |index| index + 1);
        panic!(
            "memo-capi/include/memo.h is out of date (first difference at line {line}); regenerate it with\n  \
             MEMO_BLESS=1 cargo test -p memo-capi --test header\nand commit it"
        );
    }
}
