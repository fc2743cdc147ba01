-- Nexmark q2: selection. The bids on every 123rd auction.
SELECT auction, price FROM STREAM bid WHERE auction % 123 = 0;
