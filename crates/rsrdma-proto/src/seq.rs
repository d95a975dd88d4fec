//! Arrival checks for the fragment sequence: RC delivers in order, so every DATA frame must
//! continue the message in progress or start the next one, and FIN must fall between messages.

use crate::error::ProtoError;
use crate::frame::Header;

#[derive(Debug, Default)]
pub(crate) struct RxSequence {
    in_message: bool,
    msg_id: u16,
    got: u64,
    total: u64,
    /// Messages whose last fragment arrived.
    pub(crate) messages: u64,
    /// The peer's FIN arrived.
    pub(crate) fin: bool,
}

impl RxSequence {
    #[inline(always)]
    pub(crate) fn on_data(
        &mut self,
        h: &Header,
        max_message: u32,
        max_payload: u32,
    ) -> Result<(), ProtoError> {
        let seq = |reason| Err(ProtoError::Sequence { reason });
        if self.fin {
            return Err(ProtoError::DataAfterFin { what: "DATA" });
        }
        if h.payload_len > max_payload {
            return Err(ProtoError::OversizeFragment {
                len: h.payload_len,
                max: max_payload,
            });
        }
        if h.first() {
            if self.in_message {
                return seq("a first fragment inside a message");
            }
            if h.msg_id != self.messages as u16 {
                return seq("a message id out of order");
            }
            if h.aux > max_message {
                return Err(ProtoError::MessageTooLarge {
                    len: h.aux,
                    max: max_message,
                });
            }
            *self = Self {
                in_message: true,
                msg_id: h.msg_id,
                got: 0,
                total: u64::from(h.aux),
                ..*self
            };
        } else if !self.in_message {
            return seq("a continuation without a first fragment");
        } else if h.msg_id != self.msg_id {
            return seq("a continuation of another message");
        }
        self.got += u64::from(h.payload_len);
        if self.got > self.total {
            return seq("fragments longer than their message");
        }
        if h.last() != (self.got == self.total) {
            return seq("the last flag and the message length disagree");
        }
        if h.last() {
            self.in_message = false;
            self.messages += 1;
        }
        Ok(())
    }

    /// An RTS is a whole message in one frame: it falls between messages, like a FIRST.
    pub(crate) fn on_rts(&mut self, h: &Header, max_message: u32) -> Result<(), ProtoError> {
        if self.fin {
            return Err(ProtoError::DataAfterFin { what: "RTS" });
        }
        if self.in_message {
            return Err(ProtoError::Sequence {
                reason: "an RTS inside a message",
            });
        }
        if h.msg_id != self.messages as u16 {
            return Err(ProtoError::Sequence {
                reason: "a message id out of order",
            });
        }
        if h.aux > max_message {
            return Err(ProtoError::MessageTooLarge {
                len: h.aux,
                max: max_message,
            });
        }
        self.messages += 1;
        Ok(())
    }

    pub(crate) fn on_fin(&mut self, h: &Header) -> Result<(), ProtoError> {
        if self.fin {
            return Err(ProtoError::DataAfterFin {
                what: "a second FIN",
            });
        }
        if self.in_message {
            return Err(ProtoError::Sequence {
                reason: "FIN inside a message",
            });
        }
        if h.msg_id != self.messages as u16 {
            return Err(ProtoError::Sequence {
                reason: "FIN counts other messages than arrived",
            });
        }
        self.fin = true;
        Ok(())
    }
}
