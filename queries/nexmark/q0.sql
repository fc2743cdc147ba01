-- Nexmark q0: pass-through. Every bid as it is: the cost of reading the events and writing them
-- out, the floor under every other query.
SELECT auction, bidder, price, date_time, extra FROM STREAM bid;
