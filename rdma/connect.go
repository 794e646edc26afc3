// Out-of-band connection setup: exchange QPInfo over a stream and bring both QPs to RTS.

package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

const (
	connectMagic   = "RKVQ"
	connectVersion = 1
	maxInfoString  = 255
	readyByte      = 0x52 // 'R': this side is in RTR
)

// ConnectQP connects qp to the QP at the other end of conn, which runs
// ConnectQP too: both sides send their QPInfo, move their QP through INIT to
// RTR with the peer's info, wait until the peer is in RTR as well (so no
// request reaches a QP that cannot take it yet), then move to RTS. It works
// for every provider and returns the peer's QPInfo. ctx bounds the whole
// exchange; conn stays open and is the caller's to close.
func ConnectQP(ctx context.Context, conn net.Conn, qp QP) (QPInfo, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	defer func() { _ = conn.SetDeadline(time.Time{}) }()

	remote, err := exchangeInfo(conn, qp.Info())
	if err != nil {
		return QPInfo{}, ctxErr(ctx, fmt.Errorf("rdma: QP %d: exchanging QP info: %w", qp.Num(), err))
	}
	if qp.State() == QPStateReset {
		if err := qp.ModifyToInit(); err != nil {
			return remote, err
		}
	}
	if err := qp.ModifyToRTR(remote); err != nil {
		return remote, err
	}
	if err := exchangeReady(conn); err != nil {
		return remote, ctxErr(ctx, fmt.Errorf("rdma: QP %d: waiting for peer QP %d to reach RTR: %w", qp.Num(), remote.QPNum, err))
	}
	return remote, qp.ModifyToRTS()
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", err, ctx.Err())
	}
	return err
}

// exchangeInfo writes local and reads the peer's info concurrently, so
// neither side depends on the other reading first.
func exchangeInfo(conn net.Conn, local QPInfo) (QPInfo, error) {
	msg, err := MarshalQPInfo(local)
	if err != nil {
		return QPInfo{}, err
	}
	werr := make(chan error, 1)
	go func() { _, err := conn.Write(msg); werr <- err }()
	remote, rerr := readQPInfo(conn)
	if err := <-werr; err != nil {
		return QPInfo{}, err
	}
	if rerr != nil {
		return QPInfo{}, rerr
	}
	if remote.Provider != local.Provider {
		return QPInfo{}, fmt.Errorf("peer uses provider %q, this side %q", remote.Provider, local.Provider)
	}
	return remote, nil
}

func exchangeReady(conn net.Conn) error {
	werr := make(chan error, 1)
	go func() { _, err := conn.Write([]byte{readyByte}); werr <- err }()
	var b [1]byte
	_, rerr := io.ReadFull(conn, b[:])
	if err := <-werr; err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	if b[0] != readyByte {
		return fmt.Errorf("peer sent %#x instead of its ready byte", b[0])
	}
	return nil
}

// MarshalQPInfo encodes info in the out-of-band wire format: magic, version,
// then length-prefixed fields in big-endian order.
func MarshalQPInfo(info QPInfo) ([]byte, error) {
	if len(info.Provider) > maxInfoString || len(info.Addr) > maxInfoString {
		return nil, fmt.Errorf("rdma: QPInfo provider %q or addr %q longer than %d bytes", info.Provider, info.Addr, maxInfoString)
	}
	body := make([]byte, 0, 64)
	body = append(body, byte(len(info.Provider)))
	body = append(body, info.Provider...)
	body = binary.BigEndian.AppendUint32(body, info.QPNum)
	body = binary.BigEndian.AppendUint32(body, info.PSN)
	body = binary.BigEndian.AppendUint16(body, info.LID)
	body = append(body, info.GID[:]...)
	body = binary.BigEndian.AppendUint32(body, uint32(info.MTU))
	body = append(body, byte(len(info.Addr)))
	body = append(body, info.Addr...)

	msg := append([]byte(connectMagic), connectVersion)
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(body)))
	return append(msg, body...), nil
}

func readQPInfo(r io.Reader) (QPInfo, error) {
	var hdr [len(connectMagic) + 3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return QPInfo{}, err
	}
	if string(hdr[:4]) != connectMagic {
		return QPInfo{}, fmt.Errorf("peer is not an rkv QP endpoint (got %q)", hdr[:4])
	}
	if hdr[4] != connectVersion {
		return QPInfo{}, fmt.Errorf("peer speaks connect version %d, this side %d", hdr[4], connectVersion)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[5:]))
	if _, err := io.ReadFull(r, body); err != nil {
		return QPInfo{}, err
	}
	return UnmarshalQPInfo(body)
}

var errShortInfo = errors.New("truncated QP info")

// UnmarshalQPInfo decodes the body (after magic, version and length) of a
// message from MarshalQPInfo.
func UnmarshalQPInfo(b []byte) (QPInfo, error) {
	var info QPInfo
	str := func() (string, error) {
		if len(b) < 1 {
			return "", errShortInfo
		}
		n := 1 + int(b[0]) // in int: 1+b[0] would wrap at 255
		if len(b) < n {
			return "", errShortInfo
		}
		s := string(b[1:n])
		b = b[n:]
		return s, nil
	}
	var err error
	if info.Provider, err = str(); err != nil {
		return info, err
	}
	const fixed = 4 + 4 + 2 + 16 + 4
	if len(b) < fixed {
		return info, errShortInfo
	}
	info.QPNum = binary.BigEndian.Uint32(b)
	info.PSN = binary.BigEndian.Uint32(b[4:])
	info.LID = binary.BigEndian.Uint16(b[8:])
	copy(info.GID[:], b[10:26])
	info.MTU = int(binary.BigEndian.Uint32(b[26:]))
	b = b[fixed:]
	if info.Addr, err = str(); err != nil {
		return info, err
	}
	if len(b) != 0 {
		return info, fmt.Errorf("%d trailing bytes after QP info", len(b))
	}
	return info, nil
}
