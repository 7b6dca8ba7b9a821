// Package uffdtest gives tests a page whose every access waits until the
// test fills it: a caller's ifreq there stalls whoever reads it, the
// kernel's process_vm_readv and copy_from_user too (security issue 41).
package uffdtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's userfaultfd ABI (include/uapi/linux/userfaultfd.h), which
// golang.org/x/sys lacks.
const (
	uffdAPI          = 0xaa
	ioctlAPI         = 0xc018aa3f // _IOWR(0xaa, 0x3f, struct uffdio_api)
	ioctlRegister    = 0xc020aa00 // _IOWR(0xaa, 0x00, struct uffdio_register)
	ioctlCopy        = 0xc028aa03 // _IOWR(0xaa, 0x03, struct uffdio_copy)
	registerModeMiss = 1          // UFFDIO_REGISTER_MODE_MISSING
)

type apiArg struct{ API, Features, Ioctls uint64 }
type registerArg struct{ Start, Len, Mode, Ioctls uint64 }
type copyArg struct {
	Dst, Src, Len, Mode uint64
	Copy                int64
}

// Page is an anonymous page registered with a userfaultfd for missing
// pages, which nobody fills until Fill.
type Page struct {
	Addr uintptr
	fd   int
	once sync.Once
}

// New maps a Page. It needs root (vm.unprivileged_userfaultfd or
// CAP_SYS_PTRACE): UFFD_USER_MODE_ONLY, which anyone may use, would
// answer the kernel's own accesses with EFAULT instead of stalling them.
func New() (*Page, error) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("userfaultfd: %w", errno)
	}
	p := &Page{fd: int(fd)}
	fail := func(what string, err error) (*Page, error) {
		p.Release()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := ioctl(p.fd, ioctlAPI, unsafe.Pointer(&apiArg{API: uffdAPI})); err != nil {
		return fail("UFFDIO_API", err)
	}
	mem, err := unix.MmapPtr(-1, 0, nil, uintptr(os.Getpagesize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fail("mmap", err)
	}
	p.Addr = uintptr(mem)
	reg := registerArg{Start: uint64(p.Addr), Len: uint64(os.Getpagesize()), Mode: registerModeMiss}
	if err := ioctl(p.fd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fail("UFFDIO_REGISTER", err)
	}
	return p, nil
}

// Fill copies b to the start of the page and wakes every access waiting
// on it.
func (p *Page) Fill(b []byte) error {
	size := os.Getpagesize()
	src, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(src)
	copy(src, b)
	arg := copyArg{Dst: uint64(p.Addr), Src: uint64(uintptr(unsafe.Pointer(&src[0]))), Len: uint64(size)}
	if err := ioctl(p.fd, ioctlCopy, unsafe.Pointer(&arg)); err != nil {
		return fmt.Errorf("UFFDIO_COPY to the page at 0x%x: %w", p.Addr, err)
	}
	return nil
}

// Release closes the userfaultfd: every access waiting on the page, and
// every later one, faults it in as plain memory (zeros).
func (p *Page) Release() {
	p.once.Do(func() { unix.Close(p.fd) })
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// ThreadIn reports whether a thread of process pid is blocked in syscall
// nr (/proc/PID/task/*/syscall).
func ThreadIn(pid, nr int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, _ := os.ReadDir(dir)
	for _, task := range tasks {
		b, err := os.ReadFile(dir + task.Name() + "/syscall")
		if err == nil && strings.HasPrefix(string(b), strconv.Itoa(nr)+" ") {
			return true
		}
	}
	return false
}
