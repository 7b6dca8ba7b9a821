package unixsock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Rights is the control message that passes files (SCM_RIGHTS). It reads
// each fd through SyscallConn: Fd would switch the file to blocking mode.
func Rights(files []*os.File) ([]byte, error) {
	if len(files) == 0 {
		return nil, nil
	}
	fds := make([]int, len(files))
	for i, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return nil, err
		}
		if err := rc.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
			return nil, err
		}
	}
	return unix.UnixRights(fds...), nil
}

// ParseRights returns the files the control messages in oob passed, each
// named name: all that came, even with an error, for the caller to close.
func ParseRights(oob []byte, name string) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	var errs error
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), name))
		}
	}
	return files, errs
}
