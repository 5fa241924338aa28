//go:build unix

package archive

import "syscall"

// oNoFollow makes opening a symlink fail. With O_EXCL it is redundant on
// Linux, but it states the intent and guards other kernels.
const oNoFollow = syscall.O_NOFOLLOW
