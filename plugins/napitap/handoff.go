package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
)

// handOff gives the open queues to napitapd, which keeps them until a
// runtime fetches them: NAPI only reaches a guest through fds napitap
// opened, or through napitapd's TUNSETIFF on the runtime's own fd
// (DESIGN.md facts 6, 12). In intercept mode napitapd records the
// attachment without fds, for the latter; without "required", a napitapd
// that cannot record it is logged and ADD goes on, as the runtime's own
// open still works. In fds mode napitapd is the runtime's only way to the
// queues, so ADD fails whatever "required" says.
func handOff(conf *config.Config, args *skel.CmdArgs, att *handoff.Attachment, queues []*os.File) error {
	if conf.HandoffSocket == "" {
		return nil
	}
	if conf.HandoffMode == config.HandoffIntercept {
		att.Intercept, queues = true, nil
	}
	err := checkSocket(conf.HandoffSocket)
	if err == nil {
		client := &handoff.Client{Socket: conf.HandoffSocket}
		err = client.Register(att, queues)
		if handoff.IsCode(err, handoff.CodeExists) {
			// A stale record of an attachment whose DEL never reached
			// napitapd; the tap it named is gone, or this ADD would have
			// failed to create ours.
			if err = client.Release(att.Key); err == nil {
				err = client.Register(att, queues)
			}
		}
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, handoff.ErrUnreachable) {
		// napitapd may have kept the queues before the answer got lost.
		_ = (&handoff.Client{Socket: conf.HandoffSocket}).Release(att.Key)
	}
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		return err
	}
	if !handoffNeeded(conf) {
		fmt.Fprintf(os.Stderr, "napitap: tap %q of %s: napitapd did not record the attachment, the VMM's queues will have no NAPI: %v\n", att.TapName, att.Key, err)
		return nil
	}
	// napitapd refused (a protocol error): say why. Anything else is
	// napitapd down or dying, which a retry can outlive.
	var refused *handoff.Error
	if errors.As(err, &refused) {
		return fmt.Errorf("handoff of tap %q: %w", att.TapName, err)
	}
	hint := ""
	if errors.Is(err, handoff.ErrUnreachable) {
		hint = " (is the napitap DaemonSet running on this node?)"
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("handoff: %v%s", err, hint), "")
}

// handsOverQueues: ADD's queues go to napitapd (fds mode); in any other
// mode ADD closes them.
func handsOverQueues(conf *config.Config) bool {
	return conf.HandoffSocket != "" && conf.HandoffMode == config.HandoffFDs
}

// handoffNeeded: ADD fails when napitapd cannot take the attachment.
func handoffNeeded(conf *config.Config) bool {
	return conf.HandoffRequired || conf.HandoffMode == config.HandoffFDs
}

// checkSocket: a path that exists but is no socket is a config error, not
// a daemon that is down.
func checkSocket(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("%w: %s: %v", handoff.ErrUnreachable, path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("handoff.socket: %s is not a socket", path), "")
	}
	return nil
}

// releaseTimeout bounds DEL's wait for napitapd. Longer than the client's
// default: a burst of DELs keeps rtnl busy, which each queue napitapd
// closes waits for, and a release that gives up leaves napitapd holding
// the queues until its next sweep.
const releaseTimeout = 30 * time.Second

// releaseHandoff tells napitapd to drop the attachment. DEL must succeed
// with napitapd down: it sweeps attachments whose tap is gone when it runs.
func releaseHandoff(conf *config.Config, key handoff.Key) {
	if conf.HandoffSocket == "" {
		return
	}
	client := &handoff.Client{Socket: conf.HandoffSocket, Timeout: releaseTimeout}
	if err := client.Release(key); err != nil && !errors.Is(err, handoff.ErrUnreachable) {
		fmt.Fprintf(os.Stderr, "napitap: release %s from napitapd: %v\n", key, err)
	}
}
