package cli

// SplitCommand is splitCommand for the external tests.
var SplitCommand = splitCommand
