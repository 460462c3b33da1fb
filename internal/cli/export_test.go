package cli

// SplitCommand is splitCommand for the external tests.
var SplitCommand = splitCommand

// ArchiveDir is archiveDir for the external tests.
var ArchiveDir = archiveDir
