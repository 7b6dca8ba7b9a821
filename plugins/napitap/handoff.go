package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// handOff gives the open queues to napitapd, which keeps them until a
// runtime fetches them: NAPI only reaches a guest through fds napitap
// opened (DESIGN.md fact 6). Without "required", a napitapd that cannot take
// them is logged and ADD goes on.
func handOff(conf *config.Config, args *skel.CmdArgs, att *handoff.Attachment, queues []*os.File) error {
	if conf.HandoffSocket == "" {
		return nil
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
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		return err
	}
	if !conf.HandoffRequired {
		fmt.Fprintf(os.Stderr, "napitap: tap %q of %s: queues not handed off, the VMM will open them without NAPI: %v\n", att.TapName, att.Key, err)
		return nil
	}
	if errors.Is(err, handoff.ErrUnreachable) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("handoff: napitapd at %s: %v", conf.HandoffSocket, err), "")
	}
	return fmt.Errorf("handoff of tap %q: %w", att.TapName, err)
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

// releaseHandoff tells napitapd to drop the attachment. DEL must succeed
// with napitapd down: it sweeps attachments whose tap is gone when it runs.
func releaseHandoff(conf *config.Config, key handoff.Key) {
	if conf.HandoffSocket == "" {
		return
	}
	client := &handoff.Client{Socket: conf.HandoffSocket}
	if err := client.Release(key); err != nil && !errors.Is(err, handoff.ErrUnreachable) {
		fmt.Fprintf(os.Stderr, "napitap: release %s from napitapd: %v\n", key, err)
	}
}

// gcHandoff removes every attachment of this network that napitapd knows
// and the runtime no longer lists: the tap and its wiring, when the pod
// netns is still there, and napitapd's queues. A runtime that crashed
// between ADD and DEL leaves exactly these behind.
func gcHandoff(conf *config.Config) {
	if conf.HandoffSocket == "" {
		return
	}
	client := &handoff.Client{Socket: conf.HandoffSocket}
	atts, err := client.List()
	if err != nil {
		if !errors.Is(err, handoff.ErrUnreachable) {
			fmt.Fprintf(os.Stderr, "napitap: gc: list napitapd: %v\n", err)
		}
		return
	}
	valid := make([]handoff.Key, 0, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid = append(valid, handoff.Key{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	for _, att := range atts {
		if att.Network != conf.Name || slices.Contains(valid, att.Key) {
			continue
		}
		if err := removeStaleTap(&att); err != nil {
			fmt.Fprintf(os.Stderr, "napitap: gc: %s: %v\n", att.Key, err)
		}
	}
	if _, err := client.GC(conf.Name, valid); err != nil {
		fmt.Fprintf(os.Stderr, "napitap: gc in napitapd: %v\n", err)
	}
}

// removeStaleTap deletes an attachment's tap and wiring, but only in the
// very netns napitapd recorded: a path now naming another pod's netns is
// left alone.
func removeStaleTap(att *handoff.Attachment) error {
	var st unix.Stat_t
	if err := unix.Stat(att.Netns, &st); err != nil || st.Ino != att.NetnsInode {
		return nil // the netns went with its tap
	}
	err := ns.WithNetNSPath(att.Netns, func(ns.NetNS) error {
		var err error
		switch att.Wiring {
		case config.WiringTCRedirect:
			err = tapsetup.UnwireRedirect(att.IfName)
		case config.WiringBridge:
			guestMAC, _ := net.ParseMAC(att.MAC)
			err = tapsetup.UnwireBridge(att.Bridge, att.IfName, tapsetup.PeerIdentity{MAC: guestMAC})
		}
		if err != nil {
			return err
		}
		if err := tapsetup.DeleteTap(att.TapName); err != nil && !errors.Is(err, tapsetup.ErrNotTap) {
			return err
		}
		return nil
	})
	if isGone(err) {
		return nil
	}
	return err
}
