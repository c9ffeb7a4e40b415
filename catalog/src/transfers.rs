//! Which actions move a file that the server handles itself: a catalog
//! property, read by the supervisor (to plan a transfer and refuse what it
//! cannot do) and passed to the network executor with the request (to
//! stream into or out of the file it receives). No other crate names these
//! actions.

/// How the server moves an action's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileTransfer {
    /// `execution.input_file` is uploaded in chunks from the upload root.
    Upload,
    /// The streamed file is written into the download directory.
    Download,
}

/// The transfer actions, by canonical name.
pub(crate) const TRANSFERS: &[(&str, FileTransfer)] = &[
    ("upload_file_stream", FileTransfer::Upload),
    ("download_file_stream", FileTransfer::Download),
    ("download_file_image_stream", FileTransfer::Download),
    ("download_file_record_stream", FileTransfer::Download),
];

/// The transfer kind of the action named `canonical`.
pub(crate) fn of(canonical: &str) -> Option<FileTransfer> {
    TRANSFERS.iter().find(|(n, _)| *n == canonical).map(|(_, k)| *k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalog;

    #[test]
    fn every_transfer_is_a_supported_stream_action_of_the_catalog() {
        let c = Catalog::bundled();
        for (name, kind) in TRANSFERS {
            let a = c.get(name).unwrap_or_else(|| panic!("{name} is not in the catalog"));
            assert_eq!(a.name, *name, "{name} must be canonical");
            assert!(a.stream && a.support == "supported", "{name}");
            assert_eq!(a.transfer, Some(*kind));
        }
        let n = c.actions.iter().filter(|a| a.transfer.is_some()).count();
        assert_eq!(n, TRANSFERS.len());
        assert!(c.actions.iter().filter(|a| a.transfer == Some(FileTransfer::Upload)).all(|a| !a.read_only));
    }
}
