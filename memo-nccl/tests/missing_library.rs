//! Without the library, loading returns one error that names every file tried and the fix,
//! and never panics.

#[path = "../../tests/support/skip.rs"]
mod skip;

use memo_nccl::{load_nccl, load_rccl, Nccl, NcclError, Search, NCCL, RCCL};

fn empty_folder(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("no-library-{name}"));
    std::fs::create_dir_all(&dir).expect("temporary folder");
    dir
}

#[test]
fn an_empty_folder_lists_every_name_tried() {
    for flavour in [NCCL, RCCL] {
        let dir = empty_folder(flavour.library);
        let error = Nccl::load(&flavour, &Search::only([&dir])).expect_err("nothing there");
        assert_eq!(
            error,
            NcclError::LibraryNotFound {
                flavour,
                tried: vec![format!("{}/{{{}}} (no such file)", dir.display(), flavour.names.join(","))],
            }
        );
        assert!(error.is_unavailable());
        assert!(error.to_string().contains(&format!("or set {} to the library file", flavour.variable)));
    }
}

#[test]
fn an_explicit_file_that_is_missing_or_not_a_library_is_the_only_one_tried() {
    let dir = empty_folder("explicit");
    let missing = dir.join("libnccl.so.2");
    let _ = std::fs::remove_file(&missing);
    let not_elf = dir.join("librccl.so.1");
    std::fs::write(&not_elf, b"not an ELF file").expect("write");
    for (flavour, path) in [(NCCL, &missing), (RCCL, &not_elf)] {
        match Nccl::load(&flavour, &Search::file(path)) {
            Err(NcclError::LibraryNotFound { tried, .. }) => {
                assert_eq!(tried.len(), 1, "{tried:?}");
                assert!(tried[0].starts_with(&format!("{} (", path.display())), "{tried:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_default_search_names_the_sonames_and_the_variable() {
    for (flavour, load) in [
        (NCCL, (|| load_nccl()) as fn() -> Result<Nccl, NcclError>),
        (RCCL, || load_rccl(vec![empty_folder("rccl-default")])),
    ] {
        if std::env::var_os(flavour.variable).is_some() {
            skip::skip(format!("{} is set here; the default search is not what runs", flavour.variable));
            continue;
        }
        match load() {
            Ok(found) => skip::skip(format!(
                "{} is installed here ({found:?}); the missing path is not reachable",
                flavour.library
            )),
            Err(error) => {
                let NcclError::LibraryNotFound { tried, .. } = &error else { panic!("{error}") };
                for name in flavour.names {
                    assert!(
                        tried.iter().any(|t| t.starts_with(&format!("{name} by the system search ("))),
                        "{tried:?}"
                    );
                }
                let text = error.to_string();
                assert!(text.starts_with(&format!("{} cannot be loaded; tried ", flavour.library)), "{text}");
                assert!(text.contains(flavour.variable), "{text}");
            }
        }
    }
}
